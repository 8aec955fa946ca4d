-- queue_counts.lua: count a delay queue's items by state, by the server's clock.
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
--   {-1, key, type}                  a key holds something fencelock did not write

for i, want in ipairs({'zset', 'zset'}) do
  local found = redis.call('TYPE', KEYS[i]).ok
  if found ~= 'none' and found ~= want then
    return {-1, KEYS[i], found}
  end
end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local ready = redis.call('ZCOUNT', KEYS[1], '-inf', now)
local total = redis.call('ZCARD', KEYS[1])
return {1, ready, total - ready, redis.call('ZCARD', KEYS[2])}
