-- reentrant_release.lua: give up one hold; the last hold deletes the lock and wakes the
-- waiters.
--
-- KEYS[1]  lock key (a hash, see reentrant_acquire.lua)
-- ARGV[1]  owner id
-- ARGV[2]  acquisition token of the hold
-- ARGV[3]  release channel: an empty message there announces the release
--
-- Reply, an integer:
--    1   released this hold (and the lock, if it was the last)
--    0   not held: the key is absent (the lease expired)
--   -1   not held: another owner holds the key, or this hold is gone (the lease expired
--        and the owner took the lock again)
--   -2   the key holds a type fencelock did not write; left untouched

local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
  return 0
elseif kind == 'string' then
  return -1 -- a plain lock holds it now
elseif kind ~= 'hash' then
  return -2
end
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return -1
end
if redis.call('HDEL', KEYS[1], 'hold:' .. ARGV[2]) == 0 then
  return -1
end
-- Left: "owner", "fence", and one field per remaining hold.
if redis.call('HLEN', KEYS[1]) <= 2 then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], '')
end
return 1
