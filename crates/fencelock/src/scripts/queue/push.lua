-- push.lua: add an item to a delay queue, due `delay` ms after now by the server's
-- clock.
--
-- KEYS[1]  due set       ZSET  item id -> due time (server ms since the epoch)
-- KEYS[2]  items         HASH  item id -> payload
-- KEYS[3]  id counter    plain integer string, never expires; at most 15 digits, so the
--                        ids stay exact in Lua's double-precision numbers
-- ARGV[1]  payload       bytes, any content
-- ARGV[2]  delay         milliseconds, a non-negative integer
--
-- Item ids are stored as 20 zero-padded decimal digits: ZSET members with equal scores
-- sort bytewise, so padding makes items due in the same millisecond come out by id.
--
-- Reply, an array whose first element says which case happened:
--   {1, id}           pushed; id is the new item's number
-- A key that holds data fencelock did not write: wrong_type() (types.lua); nothing
-- written.

local bad = check_types({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'string'})
if bad then
  return bad
end
local counter = redis.call('GET', KEYS[3])
if counter and (not string.match(counter, '^%d+$') or string.len(counter) > 15) then
  return wrong_type(KEYS[3], 'string')
end

local now = server_ms()

-- A counter that was deleted by hand restarts at 1: skip ids still in use rather than
-- overwrite a live item's payload.
local id, member
repeat
  id = redis.call('INCR', KEYS[3])
  member = string.format('%020d', id)
until redis.call('HEXISTS', KEYS[2], member) == 0

redis.call('HSET', KEYS[2], member, ARGV[1])
redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[2])), member)
return {1, id}
