-- counts.lua: count a delay queue's items by state, by the server's clock.
-- Writes nothing.
--
-- KEYS[1]  due set       ZSET  item id -> due time (server ms since the epoch)
-- KEYS[2]  in flight     ZSET  item id -> visibility deadline (server ms)
-- ARGV[]   none
--
-- Reply, an array whose first element says which case happened:
--   {1, ready, delayed, in_flight}   ready: due now; delayed: due later; in_flight:
--                                    delivered and not acked (including those whose
--                                    deadline passed, until a take puts them back)
-- A key that holds data fencelock did not write: wrong_type() (types.lua); nothing
-- written.

local bad = check_types({KEYS[1], 'zset', KEYS[2], 'zset'})
if bad then
  return bad
end
local now = string.format('%d', server_ms())
local ready = redis.call('ZCOUNT', KEYS[1], '-inf', now)
local total = redis.call('ZCARD', KEYS[1])
return {1, ready, total - ready, redis.call('ZCARD', KEYS[2])}
