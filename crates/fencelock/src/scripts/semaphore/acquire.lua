-- acquire.lua: take one of a semaphore's permits if one is free, as a lease
-- of its own, and mint a fencing token for it, in one round trip. One node only.
--
-- KEYS[1]  permit set      a ZSET: each holder token, scored with its lease's end
--                          (server ms); the key expires with the longest lease
-- KEYS[2]  fence counter   plain integer string, as for a lock (fence.lua)
-- KEYS[3]  permit count    plain integer string: how many permits the semaphore has;
--                          expires like the counter, after ARGV[4] without a grant
-- ARGV[1]  holder token    32 lowercase hex digits, fresh for every acquisition
-- ARGV[2]  ttl             milliseconds, a positive integer
-- ARGV[3]  permits         the caller's permit count, a positive integer
-- ARGV[4]  counter idle time, ms ("0": never), for the counter and the permit count
--
-- Reply {code, value} or {3, ms, permits}:
--   code 1  acquired now; value is the new fencing token
--   code 2  the set already held this token (a retried acquire whose first reply was
--           lost): the same grant, its lease reset to ttl; value is the token already
--           minted (a new one only if the counter was wiped meanwhile)
--   code 3  every permit is held: ms until the first lease ends, and the permit count
-- A permit set of another type (a lock under this name: a string or a hash, or a
-- read-write lock's readers):
-- wrong_type(), nothing written. A permit count other than ARGV[3] while permits are
-- held, or stored: the error reply "FENCELOCK-PERMITS <count> <asked> <key>", nothing
-- written. Expired permits are dropped first (a crashed holder's permit frees itself
-- after one lease). Everything is checked before the first write.

local bad = check_types({KEYS[1], 'zset', KEYS[3], 'string'})
if bad then
  return bad
end
if redis.call('ZSCORE', KEYS[1], READERS_MARK) then
  return wrong_type(KEYS[1], 'readers') -- a read-write lock's readers
end
local counter, bad_counter = read_counter(KEYS[2])
if bad_counter then
  return wrong_type(KEYS[2], bad_counter)
end
local asked = tonumber(ARGV[3])
local stored = redis.call('GET', KEYS[3])
if stored and tonumber(stored) ~= asked then
  return redis.error_reply('FENCELOCK-PERMITS ' .. stored .. ' ' .. ARGV[3] .. ' ' .. KEYS[1])
end

local now = server_ms()
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)

local function grant(code, fence)
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  store_counter(KEYS[3], asked, ARGV[4])
  return {code, fence}
end

if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if counter == nil then
    return grant(2, next_fence(KEYS[2], counter, ARGV[4]))
  end
  return grant(2, counter)
end
if redis.call('ZCARD', KEYS[1]) < asked then
  return grant(1, next_fence(KEYS[2], counter, ARGV[4]))
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {3, math.max(tonumber(first[2]) - now, 0), asked}
