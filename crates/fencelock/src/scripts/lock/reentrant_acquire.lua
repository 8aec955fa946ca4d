-- reentrant_acquire.lua: take the lock for an owner, or add one more hold if that owner
-- holds it already (from this process or another that shares the owner id).
--
-- KEYS[1]  lock key        a hash: "owner" -> owner id, "fence" -> fencing token, and one
--                          field "hold:<token>" per live hold; PX expiry
-- KEYS[2]  fence counter   plain integer string, expiring after ARGV[4] without a grant
-- KEYS[3]  waiting writers optional: a read-write lock's writers waiting for its
--                          readers (readers.lua); a grant leaves it
-- ARGV[1]  owner id
-- ARGV[2]  acquisition token (32 hex digits, fresh for every acquire call)
-- ARGV[3]  ttl, ms
-- ARGV[4]  counter idle time, ms (as acquire.lua's ARGV[5])
-- KEYS[4]  wake list       optional, a waiting acquire's: refused by a plain holder, it
--                          lists '*' there (kept until that lease ends and ARGV[6] ms
--                          more), so that the plain holder's release wakes every client
--                          (wakes.lua), not one listed plain waiter's
-- ARGV[5]  "1": a waiting acquire: when readers hold the lock, wait among the writers
--          (KEYS[3], by the acquisition token); absent or "0": do not
-- ARGV[6]  the listing's margin, ms (with KEYS[4])
--
-- Reply:
--   {1, fence}        acquired: the first hold, a new fencing token
--   {2, fence}        an added hold (or a retry of one whose reply was lost: the hold
--                     field makes it idempotent); same fencing token, expiry reset to ttl
--   {0, pttl}         held by another owner (or by a plain, non-reentrant holder)
--   {6, ms, readers}  held by a read-write lock's readers: ms until the first of their
--                     leases ends, and how many they are
-- A key that holds data fencelock did not write (a hash without "owner" or "fence"
-- included): wrong_type(); nothing written.

local counter, bad = read_counter(KEYS[2])
if bad then
  return wrong_type(KEYS[2], bad)
end

local kind, holder = lock_holder(KEYS[1], 'reentrant')
local hold = 'hold:' .. ARGV[2]
if kind == 'foreign' and holder == 'readers' then
  local readers, frees_in, bad_writers =
    writer_meets_readers(KEYS[1], KEYS[3], ARGV[2], ARGV[3], ARGV[5] == '1')
  if bad_writers then
    return bad_writers
  elseif readers > 0 then
    return {6, frees_in, readers}
  end
  kind = 'none' -- only leases that had ended were left, and the key is gone
end
if kind == 'none' then
  local fence = next_fence(KEYS[2], counter, ARGV[4])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', fence, hold, '1')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  writer_gone(KEYS[3], ARGV[2])
  return {1, fence}
elseif kind == 'plain' then -- a plain lock holds it
  local pttl = redis.call('PTTL', KEYS[1])
  if KEYS[4] then
    list_waiter(KEYS[4], '*', math.max(pttl, 0) + tonumber(ARGV[6]), true)
  end
  return {0, pttl}
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
