-- release.lua: delete the lock only if it still holds the caller's token, and tell the
-- waiters.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  release channel: an empty message there announces the release
--
-- Reply, an integer:
--    1   released (the key held this token and is gone now)
--    0   not held: the key is absent (the lease expired)
--   -1   not held: the key holds another owner's token (it expired and was taken)
--   -2   the key holds a non-string type fencelock did not write; left untouched

-- holder_of comes from _holder.lua, loaded in front of this file.
local holder = holder_of(KEYS[1], ARGV[1])
if holder ~= 1 then
  return holder
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '')
return 1
