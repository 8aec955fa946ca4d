-- fair_leave.lua: a waiter gives up. Leave the queue, drop a grant that may have been
-- made for it without its knowing (a reply lost in a timeout, or a release that handed
-- it the lock while it was leaving), and if that frees the
-- lock or the head of the line, wake the next waiter.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue     LIST of waiting holder tokens, in arrival order
-- KEYS[3]  waiters   ZSET holder token -> deadline (server ms)
-- KEYS[4]  holder info (deleted with a grant dropped here)
-- KEYS[5]  grants    HASH holder token -> what the waiter asked for (fair_acquire.lua)
-- ARGV[1]  holder token
-- ARGV[2]  release channel
--
-- Reply, an integer: 1 if anything of this token was removed, 0 if nothing was there.
-- A key that holds data fencelock did not write: wrong_type(); nothing written.

local kind, holder = lock_holder(KEYS[1], 'plain')
if kind == 'foreign' then
  return wrong_type(KEYS[1], holder)
end
local bad = check_types({KEYS[2], 'list', KEYS[3], 'zset', KEYS[5], 'hash'})
if bad then
  return bad
end

redis.call('HDEL', KEYS[5], ARGV[1])
local removed = redis.call('LREM', KEYS[2], 0, ARGV[1]) + redis.call('ZREM', KEYS[3], ARGV[1])
if kind == 'plain' and holder == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[4])
  removed = removed + 1
  kind = 'none'
end
if removed > 0 and kind == 'none' then
  local head = redis.call('LINDEX', KEYS[2], 0)
  if head then
    announce(ARGV[2], head)
  end
end
if removed > 0 then
  return 1
end
return 0
