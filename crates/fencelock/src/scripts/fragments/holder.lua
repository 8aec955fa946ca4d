-- holder.lua: who holds a lock key; the one holder check of every script that acts on
-- a holder (acquire, release, renew, in every mode). Functions only.
--
-- lock_holder(key) -> kind, holder
--   'none'       the key is absent (never taken, expired, or deleted); holder nil
--   'plain'      a string: holder is the holder token in it (plain and fair locks, and
--                the other libraries that write the token as a plain string)
--   'reentrant'  a hash with an "owner" field: holder is that owner id
--   'foreign'    anything else, which fencelock did not write: holder is the Redis type

local function lock_holder(key)
  local kind = redis.call('TYPE', key).ok
  if kind == 'none' then
    return 'none', nil
  elseif kind == 'string' then
    return 'plain', redis.call('GET', key)
  elseif kind == 'hash' then
    local owner = redis.call('HGET', key, 'owner')
    if owner then
      return 'reentrant', owner
    end
  end
  return 'foreign', kind
end

