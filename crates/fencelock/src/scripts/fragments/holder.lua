-- holder.lua: who holds a lock key; the one holder check of every script that acts on
-- a holder (acquire, release, renew, in every mode). Functions only.
--
-- lock_holder(key, expected) -> kind, holder
--   'none'       the key is absent (never taken, expired, or deleted); holder nil
--   'plain'      a string: holder is the holder token in it (plain and fair locks, and
--                the other libraries that write the token as a plain string)
--   'reentrant'  a hash with an "owner" field: holder is that owner id
--   'foreign'    anything else: holder is the Redis type, or "readers" for a read-write
--                lock's readers (a ZSET with the member READERS_MARK, readers.lua); a
--                semaphore's permits are a "zset" without it
-- expected: the kind the calling script works on, read first with one call ('plain':
--   GET, 'reentrant': HGET owner); any other kind found costs a TYPE after it, and
--   the probe that failed on the wrong type counts in Redis's error statistics
--   (INFO errorstats), so a script that may meet either kind passes nil: TYPE first,
--   no error counted
-- holder_of(key, found) -> kind, holder, as lock_holder(key, 'plain') when a
--   redis.pcall('GET', key) already answered `found` (a script that read the key
--   before it defined this fragment's functions: the fast paths of lock/acquire.lua
--   and lock/release.lua)

-- The member, scored +inf, that marks a ZSET lock key as a read-write lock's readers
-- (never a holder token: those are 32 hex digits, with ":<owner>" for an owned reader).
local READERS_MARK = 'rwlock'

local function holder_by_type(key)
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
  elseif kind == 'zset' and redis.call('ZSCORE', key, READERS_MARK) then
    return 'foreign', 'readers'
  end
  return 'foreign', kind
end

local function holder_of(key, found)
  if not found then
    return 'none', nil
  elseif type(found) == 'string' then
    return 'plain', found
  end
  return holder_by_type(key)
end

local function lock_holder(key, expected)
  if expected == 'plain' then
    return holder_of(key, redis.pcall('GET', key))
  elseif expected == 'reentrant' then
    local owner = redis.pcall('HGET', key, 'owner')
    if type(owner) == 'string' then
      return 'reentrant', owner
    end
  end
  return holder_by_type(key)
end
