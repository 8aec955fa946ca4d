-- renew.lua: extend many leases in one round trip (the watchdog's batch; an extend is a
-- batch of one), each only if its key still holds its holder. Never creates a key.
--
-- KEYS[2i-1]  lock key of lease i: a string holding the holder token, or (reentrant
--              locks) a hash whose field "owner" holds the owner id
-- KEYS[2i]     holder info of lease i, renewed with it if there is one
-- ARGV[2i-1]   holder of lease i: the token, or the owner id of a reentrant lock
-- ARGV[2i]     new ttl of lease i, ms from now, a positive integer
--
-- Reply, an array with one integer per lease, in order (renew_lease(), lease.lua):
--    1   renewed
--    0   not held: the key is absent (the lease expired, or it was deleted)
--   -1   not held: another holder has the key, or it holds data fencelock did not
--        write (the lease is lost either way; the key is left untouched)
--
-- The keys of one call may belong to different locks of one node. On a Redis Cluster
-- every key of one call must be in one slot; renew_across_slots.lua batches a node's
-- slots. A batch never fails for one bad key.

local out = {}
for i = 1, #KEYS / 2 do
  out[i] = renew_lease(KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1], ARGV[2 * i])
end
return out
