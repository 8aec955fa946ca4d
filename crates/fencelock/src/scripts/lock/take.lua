-- take.lua: a plain lock's acquire in its common case, in one round trip: one node (no
-- Redlock identity), no holder info, not listed on the wake list, no earlier attempt
-- that waited among a read-write lock's writers. Every other attempt calls acquire.lua,
-- which this answers as (the same keys, the same counter, the same replies but the
-- first); it is shorter to run: fewer KEYS and ARGV, and its grant defines no function
-- and answers a bare integer (docs/benchmarks.md, "Redis's work per lock").
--
-- KEYS[1]  lock key        plain string holding the holder token, with a PX expiry
-- KEYS[2]  fence counter   plain integer string, expiring after ARGV[3] without a grant
-- KEYS[3]  waiting writers optional: a waiting acquire's (acquire.lua's KEYS[4] with
--          ARGV[6] "1"): when readers hold the lock, it waits among the writers
-- ARGV[1]  holder token    32 lowercase hex digits, fresh for every acquisition
-- ARGV[2]  ttl             milliseconds, a positive integer
-- ARGV[3]  counter idle time, ms: the counter expires after this long without a grant
--          ("0": never)
--
-- Reply:
--   an integer      acquired now: the new fencing token (acquire.lua's {1, token})
--   {2, token}      the key already held this token (a retried acquire whose first
--                   reply was lost): the same grant, its expiry reset to ttl; a new
--                   token only if the counter was wiped meanwhile
--   {0, pttl}       held by another holder (a plain token, or a reentrant lock's hash);
--                   its remaining ms (-1: no expiry)
--   {6, ms, count}  held by a read-write lock's readers: ms until the first of their
--                   leases ends, and how many they are
-- A key that holds data fencelock did not write (a semaphore's permits or counter
-- included): wrong_type() (types.lua); nothing written. Everything is checked before the
-- first write.

-- The grant, before any function is defined (each definition makes a closure on every
-- call): the counter read and advanced as fence.lua's read_counter and next_fence do,
-- written out here.
local raw = redis.pcall('GET', KEYS[2])
local counted = raw == false
  or (type(raw) == 'string' and #raw <= 18 and string.match(raw, '^%d+$') ~= nil)
if counted and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TIME')
  local fence = math.max((tonumber(raw) or 0) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
  if ARGV[3] ~= '0' then
    redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[3])
  else
    redis.call('SET', KEYS[2], string.format('%d', fence))
  end
  return fence
end
-- Refused by another plain holder.
local found = counted and redis.pcall('GET', KEYS[1])
if type(found) == 'string' and found ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1])}
end
-- (later fragments)
local counter, bad = read_counter(KEYS[2])
if bad then
  return wrong_type(KEYS[2], bad)
end
local kind, holder = holder_of(KEYS[1], found)
if kind == 'plain' then
  -- Our own token: a retry whose first reply was lost.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if counter == nil then
    -- The counter vanished while we held the lock: our first token is unknowable, so
    -- mint a fresh one, which is higher than any token handed out before.
    return {2, next_fence(KEYS[2], counter, ARGV[3])}
  end
  return {2, counter}
elseif kind == 'reentrant' then
  return {0, redis.call('PTTL', KEYS[1])}
elseif holder ~= 'readers' then
  return wrong_type(KEYS[1], holder or kind)
end
local readers, frees_in, bad_writers =
  writer_meets_readers(KEYS[1], KEYS[3], ARGV[1], ARGV[2], KEYS[3] ~= nil)
if bad_writers then
  return bad_writers
elseif readers > 0 then
  return {6, frees_in, readers}
end
-- Only leases that had ended were left, and the key is gone.
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return next_fence(KEYS[2], counter, ARGV[3])
