-- release.lua: delete a plain lock only if it still holds the caller's token, and tell
-- the waiters. Used on a single node, and on each node of a Redlock release.
--
-- KEYS[1]  lock key
-- KEYS[2]  fence counter
-- KEYS[3]  holder info (deleted with the lock)
-- KEYS[4]  wake list: the clients waiting for the lock (wakes.lua), of which the release
--          wakes one; absent (nobody waits), the release publishes nothing
-- KEYS[5]  waiting writers optional: a read-write lock's (readers.lua); the token leaves
--          it (a writer that gave up waiting), and when it was the last one the readers
--          it held back are woken
-- ARGV[1]  holder token
-- ARGV[2]  release channel: an empty message there (or on one listed client's own
--          channel, wakes.lua) announces the release, when a client is listed
-- ARGV[3]  the grant's fencing token (decimal), raised into the counter, whoever holds
--          the key (Redlock: the next grant on any majority gets a higher token); absent
--          or "0": leave the counter alone
-- ARGV[4]  counter idle time, ms, for a raised counter (as acquire.lua's ARGV[5]); only
--          with ARGV[3]
--
-- Reply, an integer:
--    1   released (the key held this token and is gone now)
--    0   not held: the key is absent (the lease expired)
--   -1   not held: another holder has the key (it expired and was taken), or readers
--        of a read-write lock
-- A lock key that holds data fencelock did not write: wrong_type(); nothing written. A
-- counter that is not an integer is left as it is.

-- The common cases come first, before the functions only the others need are defined
-- (the fragments after the marker lines below: each definition makes a closure on
-- every call): the caller's own plain lock, called without a waiting-writers key (a
-- read-write lock's writer passes KEYS[5], and takes the general path), on one node (no
-- token to raise the counter to), with nobody listed on the wake list (every waiter
-- lists itself: nobody waits, and nothing is announced), then with someone listed, then
-- on a Redlock node.
local found = redis.pcall('GET', KEYS[1])
local own = found == ARGV[1] and not KEYS[5]
local one_node = not ARGV[3] or ARGV[3] == '0'
if own and one_node then
  redis.call('DEL', KEYS[1], KEYS[3])
  if KEYS[4] and redis.call('EXISTS', KEYS[4]) == 0 then
    return 1
  end
end
-- (later fragments)
if own and one_node then
  wake_next(KEYS[4], ARGV[2])
  return 1
end
-- (later fragments)

local function raise_counter()
  local floor = tonumber(ARGV[3] or '0')
  if floor > 0 then
    local counter, bad = read_counter(KEYS[2])
    if not bad and (counter == nil or counter < floor) then
      store_counter(KEYS[2], floor, ARGV[4])
    end
  end
end

if own then
  raise_counter()
  redis.call('DEL', KEYS[1], KEYS[3])
  wake_next(KEYS[4], ARGV[2])
  return 1
end
-- (later fragments)
local kind, holder = holder_of(KEYS[1], found)
if kind == 'foreign' and holder ~= 'readers' then
  return wrong_type(KEYS[1], holder)
end
if writer_gone(KEYS[5], ARGV[1]) then
  announce(ARGV[2], '')
end
raise_counter()

if kind ~= 'plain' or holder ~= ARGV[1] then
  if kind == 'none' then
    return 0
  end
  return -1
end
redis.call('DEL', KEYS[1], KEYS[3])
wake_next(KEYS[4], ARGV[2])
return 1
