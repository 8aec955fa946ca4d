-- lease.lua: the renewal of one lease, the same in every renewal script (one slot, or
-- every slot of a cluster node). Needs holder.lua. Functions only.
--
-- renew_lease(key, info_key, holder, ttl) -> 1, 0 or -1
--   key       the lock key: a string holding the holder token, or (reentrant locks) a
--             hash whose field "owner" holds the owner id
--   info_key  the holder info, renewed with it if there is one
--   holder    the token, or a reentrant lock's owner id
--   ttl       the new ttl, ms from now, a positive integer
--    1   renewed
--    0   not held: the key is absent (the lease expired, or it was deleted)
--   -1   not held: another holder has the key, or it holds data fencelock did not
--        write (the lease is lost either way; the key is left untouched)

local function renew_lease(key, info_key, holder, ttl)
  local kind, found = lock_holder(key)
  if kind == 'none' then
    return 0
  elseif (kind == 'plain' or kind == 'reentrant') and found == holder then
    redis.call('PEXPIRE', key, ttl)
    redis.call('PEXPIRE', info_key, ttl)
    return 1
  end
  return -1
end

