-- take.lua: deliver the first due item of a delay queue, after putting back the
-- in-flight items whose visibility deadline has passed (their consumer died or gave up).
--
-- KEYS[1]  due set       ZSET  item id -> due time (server ms since the epoch)
-- KEYS[2]  in flight     ZSET  item id -> visibility deadline (server ms)
-- KEYS[3]  items         HASH  item id -> payload
-- KEYS[4]  attempts      HASH  item id -> deliveries so far (integer)
-- KEYS[5]  receipts      HASH  item id -> receipt of the current delivery (in flight only)
-- ARGV[1]  visibility    milliseconds, a positive integer
-- ARGV[2]  receipt       32 lowercase hex digits, fresh for every take
--
-- First, at most 100 expired in-flight items (oldest deadline first; the rest on later
-- calls) go back to the due set, due at their visibility deadline, and lose their
-- receipt. Then the first due item (lowest due time, then lowest id) moves to the
-- in-flight set with deadline now + visibility, its attempt count goes up by one, and
-- ARGV[2] becomes its receipt. Ids in the due set whose payload is gone (deleted by
-- hand) are dropped on the way.
--
-- Reply, an array whose first element says which case happened:
--   {1, id, payload, attempt}   delivered; attempt is 1 on the first delivery
--   {0}                         no item is due
-- A key that holds data fencelock did not write: wrong_type() (types.lua); nothing
-- written.

local bad = check_types({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'hash'})
if bad then
  return bad
end

local now_ms = server_ms()
local now = string.format('%d', now_ms)

local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, 100)
for i = 1, #expired, 2 do
  local member, deadline = expired[i], expired[i + 1]
  redis.call('ZREM', KEYS[2], member)
  redis.call('HDEL', KEYS[5], member)
  redis.call('ZADD', KEYS[1], deadline, member)
end

while true do
  local first = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 1)
  if #first == 0 then
    return {0}
  end
  local member = first[1]
  redis.call('ZREM', KEYS[1], member)
  local payload = redis.call('HGET', KEYS[3], member)
  if payload then
    -- Attempt counts are written only by this script; anything unreadable counts as 0.
    local attempt = math.floor(tonumber(redis.call('HGET', KEYS[4], member) or '0') or 0) + 1
    redis.call('HSET', KEYS[4], member, attempt)
    redis.call('HSET', KEYS[5], member, ARGV[2])
    redis.call('ZADD', KEYS[2], string.format('%d', now_ms + tonumber(ARGV[1])), member)
    return {1, tonumber(member), payload, attempt}
  end
  redis.call('HDEL', KEYS[4], member)
  redis.call('HDEL', KEYS[5], member)
end
