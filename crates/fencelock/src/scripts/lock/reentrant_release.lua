-- reentrant_release.lua: give up one hold; the last hold deletes the lock and wakes the
-- waiters.
--
-- KEYS[1]  lock key (a hash, see reentrant_acquire.lua)
-- KEYS[2]  waiting writers optional: a read-write lock's (readers.lua); the acquisition
--          token leaves it (a writer that gave up waiting), and when it was the last
--          one the readers it held back are woken
-- ARGV[1]  owner id
-- ARGV[2]  acquisition token of the hold
-- ARGV[3]  release channel: an empty message there announces the release
--
-- Reply, an integer:
--    1   released this hold (and the lock, if it was the last)
--    0   not held: the key is absent (the lease expired)
--   -1   not held: another owner, a plain lock or readers hold the key, or this hold
--        is gone (the lease expired and the owner took the lock again)
-- A key that holds data fencelock did not write: wrong_type(); nothing written.

local kind, holder = lock_holder(KEYS[1], 'reentrant')
if kind == 'foreign' and holder ~= 'readers' then
  return wrong_type(KEYS[1], holder)
end
if writer_gone(KEYS[2], ARGV[2]) then
  announce(ARGV[3], '')
end
if kind == 'none' then
  return 0
elseif kind ~= 'reentrant' then
  return -1
end
if holder ~= ARGV[1] then
  return -1
end
if redis.call('HDEL', KEYS[1], 'hold:' .. ARGV[2]) == 0 then
  return -1
end
-- Left: "owner", "fence", and one field per remaining hold.
if redis.call('HLEN', KEYS[1]) <= 2 then
  redis.call('DEL', KEYS[1])
  announce(ARGV[3], '')
end
return 1
