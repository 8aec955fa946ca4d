-- release.lua: give one permit back, only if the caller still holds it,
-- and tell the waiters. One node only.
--
-- KEYS[1]  permit set      a ZSET of holder tokens scored with their leases' ends
-- ARGV[1]  holder token
-- ARGV[2]  release channel: an empty message there announces the free permit
--
-- Reply, an integer:
--    1   released (the set held this token with a lease not yet over)
--    0   not held: the token is not in the set, or its lease is over (dropped now)
-- A permit set of another type: wrong_type(); nothing written.

local bad = check_types({KEYS[1], 'zset'})
if bad then
  return bad
end
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ends then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(ends) <= server_ms() then
  return 0
end
announce(ARGV[2], '')
return 1
