-- extend.lua: move a delivered item's visibility deadline to now + visibility by
-- the server's clock, only if it is still in flight under the caller's delivery (its
-- receipt).
--
-- KEYS[1]  in flight     ZSET  item id -> visibility deadline (server ms)
-- KEYS[2]  receipts      HASH  item id -> receipt of the current delivery
-- ARGV[1]  item id       20 zero-padded decimal digits
-- ARGV[2]  receipt       the receipt the delivery was taken with
-- ARGV[3]  visibility    milliseconds, a positive integer
--
-- Like ack, this succeeds past the old deadline as long as no take has put the item
-- back yet.
--
-- Reply, an array whose first element says which case happened:
--   {1}               extended
--   {0}               not in flight under this receipt; nothing was written
-- A key that holds data fencelock did not write: wrong_type() (types.lua); nothing
-- written.

local bad = check_types({KEYS[1], 'zset', KEYS[2], 'hash'})
if bad then
  return bad
end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then
  return {0}
end
local now = server_ms()
redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[3])), ARGV[1])
return {1}
