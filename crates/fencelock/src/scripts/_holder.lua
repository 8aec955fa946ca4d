-- _holder.lua: who holds a plain lock key, shared by the release scripts. scripts.rs puts
-- this file in front of each of them when it loads it. It defines a function only.
--
-- KEYS[]   none of its own: the function takes the lock key
-- ARGV[]   none
-- Reply    none
--
-- holder_of(key, token) -> code
--    1   the key holds `token`: the caller's lock
--    0   the key is absent (the lease expired, or it was deleted)
--   -1   another owner: another token, or a reentrant lock's hash
--   -2   a type fencelock did not write

local function holder_of(key, token)
  local kind = redis.call('TYPE', key).ok
  if kind == 'none' then
    return 0
  elseif kind == 'hash' and redis.call('HEXISTS', key, 'owner') == 1 then
    return -1
  elseif kind ~= 'string' then
    return -2
  elseif redis.call('GET', key) ~= token then
    return -1
  end
  return 1
end

