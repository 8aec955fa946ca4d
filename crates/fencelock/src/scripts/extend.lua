-- extend.lua: reset the lock's expiry only if it still holds the caller's token.
-- Never creates the key: a lease that has expired stays lost.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  new ttl, milliseconds from now, a positive integer
--
-- Reply, an integer:
--    1   extended
--    0   not held: the key is absent (the lease expired)
--   -1   not held: the key holds another owner's token
--   -2   the key holds a non-string type fencelock did not write; left untouched

local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
  return 0
elseif kind ~= 'string' then
  return -2
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
