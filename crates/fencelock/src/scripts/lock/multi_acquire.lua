-- multi_acquire.lua: take several plain locks at once, all of them or none, in one
-- round trip. Used on a single node (every name), on each node of a Redlock acquire,
-- and on a Redis Cluster once per slot group (the names whose keys share one slot).
--
-- For each name i (from 0), three keys, in the order the caller sorted the names:
-- KEYS[3i+1] lock key        plain string holding the holder token, with a PX expiry
-- KEYS[3i+2] fence counter   plain integer string, expiring after ARGV[5] without a grant
-- KEYS[3i+3] holder info     a plain string, what the holder says about itself, with
--                            the lock key's expiry (written when ARGV[4] is not empty)
-- ARGV[1]  holder token    32 lowercase hex digits, one for the whole grant
-- ARGV[2]  ttl             milliseconds, a positive integer (every name's lease)
-- ARGV[3]  "1": also say who the server is, its run id and uptime (as acquire.lua)
-- ARGV[4]  holder info ("" without)
-- ARGV[5]  counter idle time, ms: the counters expire after this long without a grant
--          (absent or "0": never)
--
-- Reply {code, value} or {7, ms, index}, with ARGV[3] "1" followed by run_id, uptime_s:
--   code 1  every name acquired now; value is the grant's fencing token, one for every
--           name: higher than each name's counter (and at least the server clock in
--           microseconds, fence.lua), stored in every name's counter, so each name's
--           tokens keep increasing as for a single lock
--   code 2  every key already held this token (a retried acquire whose first reply was
--           lost): the same grant, every expiry reset to ttl; value is the token already
--           minted (a new one for all, if a counter was wiped or they differ)
--   code 7  a name is held by another holder (a plain token, a reentrant lock's hash, a
--           read-write lock's readers): value is its remaining ms (-1: no expiry), index
--           its place in the call (from 1); nothing was written
-- A key that holds data fencelock did not write (a semaphore's permits included):
-- wrong_type() (types.lua); nothing written. Every key is checked before the first
-- write (scripts do not roll back).

local function reply(code, value, index)
  local out = {code, value, index}
  if ARGV[3] ~= '1' then
    return out
  end
  local info = redis.call('INFO', 'server')
  out[#out + 1] = string.match(info, 'run_id:(%x+)') or ''
  out[#out + 1] = tonumber(string.match(info, 'uptime_in_seconds:(%d+)') or '0')
  return out
end

local names = #KEYS / 3
local top, same, mine = 0, nil, 0
for i = 0, names - 1 do
  local lock, counter_key = KEYS[3 * i + 1], KEYS[3 * i + 2]
  local counter, bad = read_counter(counter_key)
  if bad then
    return wrong_type(counter_key, bad)
  end
  local kind, holder = lock_holder(lock, 'plain')
  if kind == 'plain' and holder == ARGV[1] then
    mine = mine + 1
  elseif kind == 'foreign' and holder ~= 'readers' then
    return wrong_type(lock, holder)
  elseif kind ~= 'none' then
    return reply(7, redis.call('PTTL', lock), i + 1)
  end
  if counter == nil then
    same = false
  elseif same == nil then
    same = counter
  elseif same ~= counter then
    same = false
  end
  if counter and counter > top then
    top = counter
  end
end

local code = 1
if mine == names and same then
  code = 2
end
local fence = same
if code == 1 then
  fence = math.max(top + 1, server_us())
end
for i = 0, names - 1 do
  local lock = KEYS[3 * i + 1]
  redis.call('SET', lock, ARGV[1], 'PX', ARGV[2])
  if code == 1 then
    store_counter(KEYS[3 * i + 2], fence, ARGV[5])
  end
  if ARGV[4] ~= '' then
    redis.call('SET', KEYS[3 * i + 3], ARGV[4], 'PX', ARGV[2])
  end
end
return reply(code, fence)
