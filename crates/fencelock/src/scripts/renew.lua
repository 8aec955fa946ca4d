-- renew.lua: the watchdog's batch: extend many leases in one round trip, each only if
-- its key still holds its owner's token. Never creates a key.
--
-- KEYS[i]      lock key of lease i: a string holding the owner token, or (reentrant
--              locks) a hash whose field "owner" holds it
-- ARGV[2i-1]   owner token of lease i
-- ARGV[2i]     new ttl of lease i, ms from now, a positive integer
--
-- Reply, an array with one integer per key, in KEYS order:
--    1   renewed
--    0   not held: the key is absent (the lease expired, or it was deleted)
--   -1   not held: the key holds another owner's token
--   -2   the key holds a type fencelock did not write; left untouched
--
-- The keys of one call may belong to different locks: callers group them per node (and,
-- on a Redis Cluster, per slot).

local out = {}
for i = 1, #KEYS do
  local key, token, ttl = KEYS[i], ARGV[2 * i - 1], ARGV[2 * i]
  local kind = redis.call('TYPE', key).ok
  local holder = false
  if kind == 'string' then
    holder = redis.call('GET', key)
  elseif kind == 'hash' then
    holder = redis.call('HGET', key, 'owner')
  end
  if kind == 'none' then
    out[i] = 0
  elseif not holder then
    out[i] = -2 -- neither our string nor our hash: someone else's data
  elseif holder ~= token then
    out[i] = -1
  else
    redis.call('PEXPIRE', key, ttl)
    out[i] = 1
  end
end
return out
