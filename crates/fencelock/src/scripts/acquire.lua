-- acquire.lua: take the lock if it is free, mint a fencing token, in one round trip.
--
-- KEYS[1]  lock key        plain string holding the owner token, with a PX expiry
-- KEYS[2]  fence counter   plain integer string, never expires
-- ARGV[1]  owner token     32 lowercase hex digits, fresh for every acquisition
-- ARGV[2]  ttl             milliseconds, a positive integer
--
-- Reply, an array whose first element says which case happened:
--   {1, fence}        acquired now; fence is the new counter value
--   {2, fence}        the key already held this owner token (a retried acquire whose
--                     first reply was lost): same grant, expiry reset to ttl, the fence
--                     already minted (a new one only if the counter was wiped meanwhile)
--   {0, pttl}         held by another owner (a plain token, or a reentrant lock's hash);
--                     pttl is its remaining ms (-1: no expiry)
--   {-1, key, type}   KEYS[1] or KEYS[2] holds something fencelock did not write
--                     (type is the Redis type, or "string" for a non-integer counter);
--                     nothing was written
--
-- Everything is checked before the first write: a Lua error after SET would leave the
-- lock set without a token being handed out (scripts do not roll back).

-- read_counter and next_fence come from _counter.lua, loaded in front of this file.
local counter, bad = read_counter(KEYS[2])
if bad then
  return {-1, KEYS[2], bad}
end

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, next_fence(KEYS[2], counter)}
end

local lock_type = redis.call('TYPE', KEYS[1]).ok
if lock_type == 'hash' and redis.call('HEXISTS', KEYS[1], 'owner') == 1 then
  return {0, redis.call('PTTL', KEYS[1])} -- a reentrant holder
elseif lock_type ~= 'string' then
  return {-1, KEYS[1], lock_type}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if counter == nil then
    -- The counter vanished while we held the lock: our first token is unknowable, so
    -- mint a fresh one, which is higher than any token handed out before.
    return {2, next_fence(KEYS[2], counter)}
  end
  return {2, counter}
end
return {0, redis.call('PTTL', KEYS[1])}
