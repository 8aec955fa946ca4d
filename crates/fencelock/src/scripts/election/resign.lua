-- resign.lua: a leader steps down: delete the election's lock key only if it still
-- holds the caller's token, wake one campaigner, and tell the followers. Also what a
-- campaign that ends without leading sends to take back a grant it may have got.
--
-- KEYS[1]  lock key
-- KEYS[2]  leader record (deleted with the lock key)
-- KEYS[3]  wake list: the clients campaigning (wakes.lua), of which it wakes one
-- ARGV[1]  holder token
-- ARGV[2]  release channel: wakes one campaigner, as a plain release does (wakes.lua)
-- ARGV[3]  the leader channel: an empty message there tells the followers that nobody
--          leads
--
-- Reply, an integer, as release.lua's:
--    1   resigned (the key held this token and is gone now)
--    0   not leading: the key is absent (the lease expired)
--   -1   not leading: another campaigner leads now
-- A lock key that holds data a plain lock does not: wrong_type(); nothing written.

local kind, holder = lock_holder(KEYS[1], 'plain')
if kind == 'plain' and holder == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  wake_next(KEYS[3], ARGV[2])
  announce(ARGV[3], '')
  return 1
elseif kind == 'none' then
  return 0
elseif kind == 'plain' then
  return -1
elseif kind == 'reentrant' then
  return wrong_type(KEYS[1], 'hash')
end
return wrong_type(KEYS[1], holder)
