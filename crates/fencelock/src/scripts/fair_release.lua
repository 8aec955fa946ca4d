-- fair_release.lua: delete the lock only if it still holds the caller's token, then wake
-- the first live waiter in line, and only that one.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue     LIST of waiting owner tokens, in arrival order
-- KEYS[3]  waiters   ZSET owner token -> deadline (server ms)
-- ARGV[1]  owner token
-- ARGV[2]  release channel
--
-- Reply, an integer:
--    1   released
--    0   not held: the key is absent (the lease expired)
--   -1   not held: the key holds another owner's token
--   -2   the lock key holds a non-string type fencelock did not write; left untouched

-- holder_of comes from _holder.lua, loaded in front of this file.
local holder = holder_of(KEYS[1], ARGV[1])
if holder ~= 1 then
  return holder
end
redis.call('DEL', KEYS[1])

if redis.call('TYPE', KEYS[2]).ok == 'list' and redis.call('TYPE', KEYS[3]).ok == 'zset' then
  -- purge_waiters and server_ms come from _queue.lua, loaded in front of this file.
  purge_waiters(KEYS[2], KEYS[3], server_ms())
  local head = redis.call('LINDEX', KEYS[2], 0)
  if head then
    redis.call('PUBLISH', ARGV[2], head)
  end
end
return 1
