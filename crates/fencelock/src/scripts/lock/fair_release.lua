-- fair_release.lua: delete the lock only if it still holds the caller's token, then wake
-- the first live waiter in line, and only that one.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue     LIST of waiting holder tokens, in arrival order
-- KEYS[3]  waiters   ZSET holder token -> deadline (server ms)
-- KEYS[4]  holder info (deleted with the lock)
-- ARGV[1]  holder token
-- ARGV[2]  release channel
--
-- Reply, an integer:
--    1   released
--    0   not held: the key is absent (the lease expired)
--   -1   not held: another holder has the key
-- A lock key that holds data fencelock did not write: wrong_type(); nothing written. A
-- queue key of another type is left alone (nobody is woken through it).

local kind, holder = lock_holder(KEYS[1], 'plain')
if kind == 'foreign' then
  return wrong_type(KEYS[1], holder)
elseif kind == 'none' then
  return 0
elseif kind ~= 'plain' or holder ~= ARGV[1] then
  return -1
end
redis.call('DEL', KEYS[1], KEYS[4])

if redis.call('TYPE', KEYS[2]).ok == 'list' and redis.call('TYPE', KEYS[3]).ok == 'zset' then
  purge_waiters(KEYS[2], KEYS[3], server_ms())
  local head = redis.call('LINDEX', KEYS[2], 0)
  if head then
    announce(ARGV[2], head)
  end
end
return 1
