-- lease.lua: the renewal of one lease, the same in every renewal script (one slot, or
-- every slot of a cluster node). Needs holder.lua and clock.lua. Functions only.
--
-- renew_lease(key, info_key, holder, ttl) -> 1, 0 or -1
--   key       the lock key: a string holding the holder token, (reentrant locks) a
--             hash whose field "owner" holds the owner id, or (semaphores, and a
--             read-write lock's readers) a ZSET of holder tokens scored with their
--             leases' ends (server ms); needs clock.lua
--   info_key  the holder info, renewed with it if there is one
--   holder    the token, or a reentrant lock's owner id
--   ttl       the new ttl, ms from now, a positive integer
--    1   renewed
--    0   not held: the key is absent (the lease expired, or it was deleted)
--   -1   not held: another holder has the key, or it holds data fencelock did not
--        write (the lease is lost either way; the key is left untouched)

-- A semaphore's permit or a reader's lease: renewed while its lease has not ended; an
-- ended one is dropped.
local function renew_permit(key, holder, ttl)
  local ends = redis.call('ZSCORE', key, holder)
  if not ends then
    return 0
  end
  local now = server_ms()
  if tonumber(ends) <= now then
    redis.call('ZREM', key, holder)
    return 0
  end
  redis.call('ZADD', key, 'XX', now + ttl, holder)
  if redis.call('PTTL', key) < tonumber(ttl) then
    redis.call('PEXPIRE', key, ttl)
  end
  return 1
end

local function renew_lease(key, info_key, holder, ttl)
  local kind, found = lock_holder(key)
  if kind == 'foreign' and (found == 'zset' or found == 'readers') then
    return renew_permit(key, holder, ttl)
  elseif kind == 'none' then
    return 0
  elseif (kind == 'plain' or kind == 'reentrant') and found == holder then
    redis.call('PEXPIRE', key, ttl)
    redis.call('PEXPIRE', info_key, ttl)
    return 1
  end
  return -1
end

