-- quorum_release.lua: one node's part of a Redlock release. Like release.lua, and it
-- also raises the node's fencing counter to the token the grant carried (the highest of
-- the majority), so the next grant on any majority gets a higher token.
--
-- KEYS[1]  lock key
-- KEYS[2]  fence counter
-- ARGV[1]  owner token
-- ARGV[2]  release channel: an empty message there announces the release
-- ARGV[3]  the grant's fencing token (decimal), or "0" when there was no grant
--
-- Reply, an integer:
--    1   released
--    0   not held: the key is absent
--   -1   not held: the key holds another owner's token
--   -2   a key holds a type fencelock did not write; left untouched

local floor = tonumber(ARGV[3])
local counter_type = redis.call('TYPE', KEYS[2]).ok
if counter_type == 'none' or counter_type == 'string' then
  local raw = redis.call('GET', KEYS[2])
  if raw == false or (string.match(raw, '^%d+$') and tonumber(raw) < floor) then
    if floor > 0 then
      redis.call('SET', KEYS[2], ARGV[3])
    end
  end
end

-- holder_of comes from _holder.lua, loaded in front of this file.
local holder = holder_of(KEYS[1], ARGV[1])
if holder ~= 1 then
  return holder
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '')
return 1
