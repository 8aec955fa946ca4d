#!lua flags=allow-cross-slot-keys
-- renew_across_slots.lua: the watchdog's batch on a Redis Cluster: the leases of every
-- slot that one master serves, in one call sent to that master, so that renewals cost
-- one call per node and tick, not one per slot. renew.lua otherwise.
--
-- KEYS         none. Redis refuses declared keys of different slots even with the
--              allow-cross-slot-keys flag, so the keys come in ARGV; the flag lets the
--              script touch keys of several slots of this node.
-- ARGV[4i-3]   lock key of lease i (a string holding the holder token, or a reentrant
--              lock's hash)
-- ARGV[4i-2]   holder info of lease i, renewed with it if there is one
-- ARGV[4i-1]   holder of lease i: the token, or the owner id of a reentrant lock
-- ARGV[4i]     new ttl of lease i, ms from now, a positive integer
--
-- Reply, an array with one integer per lease, in order, as renew.lua's:
--    1   renewed
--    0   not held: the key is absent (the lease expired, or it was deleted)
--   -1   not held: another holder has the key, or it holds data fencelock did not write
-- An error when a key's slot is not served here (any more), or is migrating and the
-- key is elsewhere ("Script attempted to access a non local key"): the leases before it
-- may be renewed already (renewing twice is harmless); the caller sends this node's
-- leases per slot with renew.lua, which follows MOVED and ASK.

local out = {}
for i = 1, #ARGV / 4 do
  out[i] = renew_lease(ARGV[4 * i - 3], ARGV[4 * i - 2], ARGV[4 * i - 1], ARGV[4 * i])
end
return out
