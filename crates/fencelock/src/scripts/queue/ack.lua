-- ack.lua: remove a delivered item for good, only if it is still in flight under
-- the caller's delivery (its receipt).
--
-- KEYS[1]  in flight     ZSET  item id -> visibility deadline (server ms)
-- KEYS[2]  items         HASH  item id -> payload
-- KEYS[3]  attempts      HASH  item id -> deliveries so far
-- KEYS[4]  receipts      HASH  item id -> receipt of the current delivery
-- ARGV[1]  item id       20 zero-padded decimal digits
-- ARGV[2]  receipt       the receipt the delivery was taken with
--
-- An item whose visibility deadline passed but that no take has put back yet still
-- holds the receipt, so a late ack of it succeeds: nobody else has it.
--
-- Reply, an array whose first element says which case happened:
--   {1}               acked: the item and everything stored for it are gone
--   {0}               not in flight under this receipt (put back, redelivered, acked
--                     or deleted); nothing was written
-- A key that holds data fencelock did not write: wrong_type() (types.lua); nothing
-- written.

local bad = check_types({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash'})
if bad then
  return bad
end
if redis.call('HGET', KEYS[4], ARGV[1]) ~= ARGV[2] then
  return {0}
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return {1}
