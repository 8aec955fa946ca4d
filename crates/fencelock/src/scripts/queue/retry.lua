-- retry.lua: give a delivered item back, due `delay` ms after now by the server's
-- clock, only if it is still in flight under the caller's delivery (its receipt).
--
-- KEYS[1]  due set       ZSET  item id -> due time (server ms since the epoch)
-- KEYS[2]  in flight     ZSET  item id -> visibility deadline (server ms)
-- KEYS[3]  receipts      HASH  item id -> receipt of the current delivery
-- ARGV[1]  item id       20 zero-padded decimal digits
-- ARGV[2]  receipt       the receipt the delivery was taken with
-- ARGV[3]  delay         milliseconds, a non-negative integer
--
-- The attempt count is kept: the next delivery counts on from it.
--
-- Reply, an array whose first element says which case happened:
--   {1}               back in the due set
--   {0}               not in flight under this receipt; nothing was written
-- A key that holds data fencelock did not write: wrong_type() (types.lua); nothing
-- written.

local bad = check_types({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'hash'})
if bad then
  return bad
end
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
  return {0}
end
local now = server_ms()
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[3])), ARGV[1])
return {1}
