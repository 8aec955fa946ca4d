-- renew.lua: extend many leases in one round trip (the watchdog's batch; an extend is a
-- batch of one), each only if its key still holds its holder. Never creates a key.
--
-- KEYS[2i-1]  lock key of lease i: a string holding the holder token, or (reentrant
--              locks) a hash whose field "owner" holds the owner id
-- KEYS[2i]     holder info of lease i, renewed with it if there is one
-- ARGV[2i-1]   holder of lease i: the token, or the owner id of a reentrant lock
-- ARGV[2i]     new ttl of lease i, ms from now, a positive integer
--
-- Reply, an array with one integer per lease, in order:
--    1   renewed
--    0   not held: the key is absent (the lease expired, or it was deleted)
--   -1   not held: another holder has the key, or it holds data fencelock did not
--        write (the lease is lost either way; the key is left untouched)
--
-- The keys of one call may belong to different locks: callers group them per node (and,
-- on a Redis Cluster, per slot). A batch never fails for one bad key.

local out = {}
for i = 1, #KEYS / 2 do
  local key = KEYS[2 * i - 1]
  local kind, holder = lock_holder(key)
  if kind == 'none' then
    out[i] = 0
  elseif (kind == 'plain' or kind == 'reentrant') and holder == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    redis.call('PEXPIRE', KEYS[2 * i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = -1
  end
end
return out
