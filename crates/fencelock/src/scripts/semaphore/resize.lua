-- resize.lua: set a semaphore's permit count, and wake as many waiters as it frees
-- permits. Held permits are never revoked: after a shrink below what is held, no permit
-- is granted until releases and expiries bring the holders under the new count. One
-- node only.
--
-- KEYS[1]  permit set      a ZSET of holder tokens scored with their leases' ends
-- KEYS[2]  permit count    plain integer string
-- KEYS[3]  queue           optional: a fair semaphore's LIST of waiting holder tokens
-- KEYS[4]  wake list       optional: the clients waiting for a permit (wakes.lua)
-- ARGV[1]  permits         the new count, a positive integer
-- ARGV[2]  release channel: each permit freed wakes the next client of KEYS[4] by name,
--          or, '*' listed (or a list of another type, or no list), a waiter per client
--          (an empty message here); nothing once nobody is listed; in a fair
--          semaphore, a message carrying a token wakes that waiter
-- ARGV[3]  counter idle time, ms ("0": never), for the permit count (as acquire.lua)
--
-- Reply, an array {previous, held}:
--   previous  the count before (0: none was stored)
--   held      the permits held now (leases not yet over)
-- A key of another type (a read-write lock's readers too): wrong_type(); nothing
-- written.

local bad = check_types({KEYS[1], 'zset', KEYS[2], 'string'})
if bad then
  return bad
end
if redis.call('ZSCORE', KEYS[1], READERS_MARK) then
  return wrong_type(KEYS[1], 'readers') -- a read-write lock's readers
end
local previous = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local permits = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', server_ms())
local held = redis.call('ZCARD', KEYS[1])
store_counter(KEYS[2], permits, ARGV[3])
-- One message per permit that is free now and was not before (at most 1000: waiters
-- that miss a wake still retry when the first lease ends).
local was_free = math.max(previous - held, 0)
local free = math.max(permits - held, 0)
if free > was_free and KEYS[3] and redis.call('TYPE', KEYS[3]).ok == 'list' then
  -- A fair semaphore: the first waiters in line, as many as there are free permits.
  for _, head in ipairs(redis.call('LRANGE', KEYS[3], 0, math.min(free, 1000) - 1)) do
    announce(ARGV[2], head)
  end
  return {previous, held}
end
for _ = 1, math.min(free - was_free, 1000) do
  if not wake_next(KEYS[4], ARGV[2]) then
    break -- nobody else is listed
  end
end
return {previous, held}
