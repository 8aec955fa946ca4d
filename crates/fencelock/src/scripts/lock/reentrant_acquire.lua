-- reentrant_acquire.lua: take the lock for an owner, or add one more hold if that owner
-- holds it already (from this process or another that shares the owner id).
--
-- KEYS[1]  lock key        a hash: "owner" -> owner id, "fence" -> fencing token, and one
--                          field "hold:<token>" per live hold; PX expiry
-- KEYS[2]  fence counter   plain integer string, expiring after ARGV[4] without a grant
-- ARGV[1]  owner id
-- ARGV[2]  acquisition token (32 hex digits, fresh for every acquire call)
-- ARGV[3]  ttl, ms
-- ARGV[4]  counter idle time, ms (as acquire.lua's ARGV[5])
--
-- Reply:
--   {1, fence}        acquired: the first hold, a new fencing token
--   {2, fence}        an added hold (or a retry of one whose reply was lost: the hold
--                     field makes it idempotent); same fencing token, expiry reset to ttl
--   {0, pttl}         held by another owner (or by a plain, non-reentrant holder)
-- A key that holds data fencelock did not write (a hash without "owner" or "fence"
-- included): wrong_type(); nothing written.

local counter, bad = read_counter(KEYS[2])
if bad then
  return wrong_type(KEYS[2], bad)
end

local kind, holder = lock_holder(KEYS[1], 'reentrant')
local hold = 'hold:' .. ARGV[2]
if kind == 'none' then
  local fence = next_fence(KEYS[2], counter, ARGV[4])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', fence, hold, '1')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, fence}
elseif kind == 'plain' then
  return {0, redis.call('PTTL', KEYS[1])} -- a plain lock holds it
elseif kind == 'foreign' then
  return wrong_type(KEYS[1], holder)
end

local fence = tonumber(redis.call('HGET', KEYS[1], 'fence'))
if not fence then
  return wrong_type(KEYS[1], 'hash')
end
if holder ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1])}
end
redis.call('HSET', KEYS[1], hold, '1')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {2, fence}
