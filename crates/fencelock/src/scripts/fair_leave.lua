-- fair_leave.lua: a waiter gives up. Leave the queue, drop a grant that may have been
-- made for it without its knowing (a reply lost in a timeout), and if that frees the
-- lock or the head of the line, wake the next waiter.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue     LIST of waiting owner tokens, in arrival order
-- KEYS[3]  waiters   ZSET owner token -> deadline (server ms)
-- ARGV[1]  owner token
-- ARGV[2]  release channel
--
-- Reply, an integer: 1 if anything of this token was removed, 0 if nothing was there,
-- -2 if a key holds a type fencelock did not write (nothing touched).

local wanted = {{KEYS[1], 'string'}, {KEYS[2], 'list'}, {KEYS[3], 'zset'}}
for _, kw in ipairs(wanted) do
  local found = redis.call('TYPE', kw[1]).ok
  if found ~= 'none' and found ~= kw[2] then
    return -2
  end
end

local removed = redis.call('LREM', KEYS[2], 0, ARGV[1]) + redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  removed = removed + 1
end
if removed > 0 and not redis.call('GET', KEYS[1]) then
  local head = redis.call('LINDEX', KEYS[2], 0)
  if head then
    redis.call('PUBLISH', ARGV[2], head)
  end
end
if removed > 0 then
  return 1
end
return 0
