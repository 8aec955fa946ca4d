-- multi_release.lua: give back the names of one multi-lock grant (multi_acquire.lua)
-- that still hold the caller's token, and tell each one's waiters. Used on a single
-- node, on each node of a Redlock release, and once per slot group on a Cluster: to
-- withdraw an acquire that ended without the lock, or to take back a grant the caller
-- will not keep (a Redlock minority, a Cluster's partial grant). A held multi-lock's
-- names are released one by one, as plain locks (release.lua).
--
-- For each name i (from 0), four keys, in the order of the acquire:
-- KEYS[4i+1] lock key
-- KEYS[4i+2] fence counter
-- KEYS[4i+3] holder info (deleted with the lock)
-- KEYS[4i+4] wake list: the clients waiting for that lock (wakes.lua), of which the
--            release wakes one
-- ARGV[1]    holder token
-- ARGV[2]    the grant's fencing token (decimal), raised into every name's counter,
--            whoever holds the key (Redlock); "0": leave the counters alone
-- ARGV[3]    counter idle time, ms, for a raised counter (as acquire.lua's ARGV[5])
-- ARGV[3+i+1] release channel of name i: an empty message there (or on one listed
--            client's own channel, wakes.lua) announces that name's release
--
-- Reply, an integer:
--    1   at least one key held this token and is gone now
--    0   none held it, and every key was absent
--   -1   none held it, and some key has another holder (or data of another kind,
--        which is left alone)

local floor = tonumber(ARGV[2])
local released, other = 0, false
for i = 0, #KEYS / 4 - 1 do
  local lock = KEYS[4 * i + 1]
  if floor > 0 then
    local counter, bad = read_counter(KEYS[4 * i + 2])
    if not bad and (counter == nil or counter < floor) then
      store_counter(KEYS[4 * i + 2], floor, ARGV[3])
    end
  end
  local found = redis.pcall('GET', lock)
  if found == ARGV[1] then
    redis.call('DEL', lock, KEYS[4 * i + 3])
    wake_next(KEYS[4 * i + 4], ARGV[3 + i + 1])
    released = released + 1
  elseif found then
    other = true
  end
end
if released > 0 then
  return 1
elseif other then
  return -1
end
return 0
