-- read_release.lua: end one reader's lease of a read-write lock, only if it still holds
-- it; the last reader out deletes the key and wakes the waiters (the writers). One node
-- only. The layout: readers.lua.
--
-- KEYS[1]  lock key
-- KEYS[2]  waiting writers optional: the writers that readers hold back (readers.lua)
-- KEYS[3]  wake list       optional, with KEYS[2]: the clients listed as waiting for the
--                          lock (wakes.lua: a multi-lock's waiter that readers refused)
-- ARGV[1]  the reader's member: its holder token, or "<token>:<owner>"
-- ARGV[2]  release channel: an empty message there announces that the readers are gone,
--          when someone may wait for them: a writer waits (KEYS[2] holds one) or a
--          client is listed (KEYS[3]), or the caller named neither key. Every waiter
--          that readers refuse registers as a waiting writer or lists itself before it
--          sleeps, so a release that finds neither wakes nobody by keeping quiet
--
-- Reply, an integer:
--    1   released (the lock held this reader with a lease not yet over)
--    0   not held: the reader is not among the readers, or its lease is over (dropped
--        now)
--   -1   not held: a writer (or a semaphore's permits) has the key
-- A reader with an owner whose reentrant write lock holds the key: its read hold
-- ("hold:<token>") is given back (1), if there is one.
-- A key of another type: wrong_type(); nothing written.

-- The common case first, before any function is defined (each definition makes a
-- closure on every call): the last reader (its lease and the mark are all the set
-- holds; a holder token is never a member of another set) takes the key with it, and
-- announces nothing when nobody waits.
local last = nil
local ends = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(ends) == 'string' and redis.call('ZCARD', KEYS[1]) == 2 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('DEL', KEYS[1])
  last = tonumber(ends) > now and 1 or 0
  if KEYS[2] and redis.call('EXISTS', unpack(KEYS, 2)) == 0 then
    return last
  end
end
-- (later fragments)
if last then
  announce(ARGV[2], '')
  return last
end
local kind, found = lock_holder(KEYS[1])
if kind == 'none' then
  return 0
elseif kind == 'reentrant' then
  -- A read hold under its owner's write lock (read_acquire.lua's code 4) withdrawn by
  -- an acquire whose reply was lost or that was cancelled: give the hold back, as
  -- reentrant_release.lua would.
  local token, owner = string.match(ARGV[1], '^(%x+):(.+)$')
  if not owner or owner ~= found or redis.call('HDEL', KEYS[1], 'hold:' .. token) == 0 then
    return -1
  end
  if redis.call('HLEN', KEYS[1]) <= 2 then
    redis.call('DEL', KEYS[1])
    announce(ARGV[2], '')
  end
  return 1
elseif kind == 'foreign' and found ~= 'readers' and found ~= 'zset' then
  return wrong_type(KEYS[1], found)
elseif kind ~= 'foreign' or found ~= 'readers' then
  return -1
end
ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ends then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
local now = server_ms()
local readers = readers_held(KEYS[1], now)
if readers == 0 and (not KEYS[2] or redis.call('EXISTS', unpack(KEYS, 2)) > 0) then
  announce(ARGV[2], '')
end
if tonumber(ends) <= now then
  return 0
end
return 1
