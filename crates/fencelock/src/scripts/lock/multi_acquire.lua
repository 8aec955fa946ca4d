-- multi_acquire.lua: take several plain locks at once, all of them or none, in one
-- round trip. Used on a single node (every name), on each node of a Redlock acquire,
-- and on a Redis Cluster once per slot group (the names whose keys share one slot).
--
-- For each name i (from 0), three keys (four with ARGV[6]: s, the stride, is 3 or 4),
-- in the order the caller sorted the names:
-- KEYS[si+1] lock key        plain string holding the holder token, with a PX expiry
-- KEYS[si+2] fence counter   plain integer string, expiring after ARGV[5] without a grant
-- KEYS[si+3] holder info     a plain string, what the holder says about itself, with
--                            the lock key's expiry (written when ARGV[4] is not empty)
-- KEYS[si+4] wake list       with ARGV[6]: the clients waiting for name i (wakes.lua)
-- ARGV[1]  holder token    32 lowercase hex digits, one for the whole grant
-- ARGV[2]  ttl             milliseconds, a positive integer (every name's lease)
-- ARGV[3]  "1": also say who the server is, its run id and uptime (as acquire.lua)
-- ARGV[4]  holder info ("" without)
-- ARGV[5]  counter idle time, ms: the counters expire after this long without a grant
--          (absent or "0": never)
-- ARGV[6]  a waiting acquire's client tag (absent or "": none), as acquire.lua's
--          ARGV[8]: a refusal lists the client on the held name's wake list (kept until
--          that holder's lease ends and ARGV[7] ms more), so that its release wakes the
--          client by name; "*" has it wake every client
-- ARGV[7]  the listing's margin, ms (ARGV[6])
-- ARGV[8]  "1": the client stays listed after a grant (ARGV[6])
-- ARGV[9]  "1": a release woke this client by name since its last attempt: refused by
--          the name of ARGV[10], it goes back to the head of that name's list (ARGV[6])
-- ARGV[10] the place (from 1) of the name whose release the client waits for (0:
--          none yet): a grant takes the client off that name's list, unless ARGV[8]
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

local listed = ARGV[6] and ARGV[6] ~= ''
local stride = listed and 4 or 3
local names = #KEYS / stride
local waits_on = listed and tonumber(ARGV[10]) or 0

-- The client's place on name i's wake list, after an answer: kept after a refusal by
-- a lease with pttl ms left (a grant: nil), for that lease and the margin.
local function relist(i, pttl)
  local lasts = math.max(pttl or tonumber(ARGV[2]), 0) + tonumber(ARGV[7])
  local front = pttl ~= nil and ARGV[9] == '1' and i + 1 == waits_on
  list_waiter(KEYS[stride * i + 4], ARGV[6], lasts, pttl ~= nil or ARGV[8] == '1', front)
end

local top, same, mine = 0, nil, 0
for i = 0, names - 1 do
  local lock, counter_key = KEYS[stride * i + 1], KEYS[stride * i + 2]
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
    local pttl = redis.call('PTTL', lock)
    if listed then
      relist(i, pttl)
    end
    return reply(7, pttl, i + 1)
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
  local lock = KEYS[stride * i + 1]
  redis.call('SET', lock, ARGV[1], 'PX', ARGV[2])
  if code == 1 then
    store_counter(KEYS[stride * i + 2], fence, ARGV[5])
  end
  if ARGV[4] ~= '' then
    redis.call('SET', KEYS[stride * i + 3], ARGV[4], 'PX', ARGV[2])
  end
end
if waits_on > 0 then
  relist(waits_on - 1, nil)
end
return reply(code, fence)
