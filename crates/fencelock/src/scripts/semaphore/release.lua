-- release.lua: give one permit back, only if the caller still holds it, and tell the
-- waiters; or (a waiter that gives up) leave a fair semaphore's queue. One node only.
--
-- KEYS[1]  permit set      a ZSET of holder tokens scored with their leases' ends
-- KEYS[2]  permit count    plain integer string
-- KEYS[3]  queue           fair (ARGV[3]): LIST of waiting holder tokens (acquire.lua)
-- KEYS[4]  waiters         fair: ZSET holder token -> deadline (server ms)
-- KEYS[5]  wake list       optional: the clients waiting for a permit (wakes.lua)
-- ARGV[1]  holder token
-- ARGV[2]  release channel: a release wakes the first client of KEYS[5] by name (an
--          empty message on its own channel, wakes.lua), or, '*' listed (or none of the
--          listed clients live), every client (an empty message on this channel: a
--          waiter of each); nobody listed, it publishes nothing; in a fair semaphore, a
--          message carrying a token wakes that waiter, the first in line
-- ARGV[3]  "1": a fair semaphore's (KEYS[3] and KEYS[4] are its queue); absent or "0":
--          not fair (every client of a name agrees on the mode)
--
-- Reply, an integer:
--    1   released (the set held this token with a lease not yet over)
--    0   not held: the token is not in the set, or its lease is over (dropped now)
-- A permit set of another type: wrong_type(); nothing written.

-- The common case first, before any function is defined (each definition makes a
-- closure on every call): a permit of a semaphore that is not fair, given back in time,
-- and nobody listed on the wake list (every waiter lists itself: nothing to announce).
local ends = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
local given_back = nil
if type(ends) == 'string' and ARGV[3] ~= '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  local t = redis.call('TIME')
  if tonumber(ends) <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
    return 0
  end
  if KEYS[5] and redis.call('EXISTS', KEYS[5]) == 0 then
    return 1
  end
  given_back = 1
end
-- (later fragments)
if given_back then
  wake_next(KEYS[5], ARGV[2])
  return given_back
end
if type(ends) == 'table' then
  return wrong_type(KEYS[1], redis.call('TYPE', KEYS[1]).ok)
end
local queue = ARGV[3] == '1' and redis.call('TYPE', KEYS[3]).ok == 'list'
  and redis.call('TYPE', KEYS[4]).ok == 'zset'
local left = 0
if queue then
  left = redis.call('LREM', KEYS[3], 0, ARGV[1]) + redis.call('ZREM', KEYS[4], ARGV[1])
end
local released = 0
if ends then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if tonumber(ends) > server_ms() then
    released = 1
  end
end
if released == 0 and left == 0 then
  return 0
end
if not queue then
  wake_next(KEYS[5], ARGV[2])
  return released
end
-- A fair semaphore: the permits free now go to the first waiters in line.
local now = server_ms()
purge_waiters(KEYS[3], KEYS[4], now, nil)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local permits = tonumber(redis.pcall('GET', KEYS[2])) or 0
local free = permits - redis.call('ZCARD', KEYS[1])
if free > 0 then
  for _, head in ipairs(redis.call('LRANGE', KEYS[3], 0, free - 1)) do
    announce(ARGV[2], head)
  end
end
return released
