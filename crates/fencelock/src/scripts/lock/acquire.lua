-- acquire.lua: take a plain lock if it is free and mint a fencing token, in one round
-- trip. Used on a single node, and on each node of a Redlock acquire. A plain lock is
-- also a read-write lock's writer (readers.lua).
--
-- KEYS[1]  lock key        plain string holding the holder token, with a PX expiry
-- KEYS[2]  fence counter   plain integer string, expiring after ARGV[5] without a grant
-- KEYS[3]  holder info     optional: a plain string, what the holder says about
--                          itself, with the lock key's expiry (written when ARGV[4]
--                          is not empty)
-- KEYS[4]  waiting writers optional: a read-write lock's writers waiting for its
--                          readers (readers.lua); a grant leaves it
-- KEYS[5]  wake list       with ARGV[8]: the clients waiting for the lock (wakes.lua)
-- ARGV[1]  holder token    32 lowercase hex digits, fresh for every acquisition
-- ARGV[2]  ttl             milliseconds, a positive integer
-- ARGV[3]  "1": also say who the server is, its run id and uptime (Redlock: two names
--          of one server must not vote twice, and restart protection); "0": do not
-- ARGV[4]  holder info, with KEYS[3] ("" without)
-- ARGV[5]  counter idle time, ms: the counter expires after this long without a grant
--          (absent or "0": never)
-- ARGV[6]  "1": a waiting acquire: when readers hold the lock, wait among the writers
--          (KEYS[4]) so that no new reader comes in before it; absent or "0": do not
-- ARGV[7]  "0": no earlier attempt of this acquire waited among the writers, so a grant
--          has no place there to leave (the first attempt); absent or "1": it leaves it
-- ARGV[8]  a waiting acquire's client tag (absent or "": none): a refusal by another
--          holder lists the client on KEYS[5] (unless it is listed: it keeps its
--          place), the list kept until that holder's lease ends and ARGV[9] ms more, so
--          that a release wakes the client by name (waiting.lua); a grant takes it off,
--          unless ARGV[10] is "1" (other waiters of the client wait for the lock too:
--          listed, the list kept for the new lease and ARGV[9] ms). "*": a waiter
--          that hears releases only on the lock's channel (its client's own channel is
--          not subscribed on every node): a refusal lists '*', so that the release
--          wakes every client; a grant leaves it
-- ARGV[9]  the listing's margin, ms (ARGV[8])
-- ARGV[10] "1": the client stays listed after a grant (ARGV[8])
-- ARGV[11] "1": a release woke this client by name since its last attempt: refused,
--          it goes back to the head of the list, not to its end (ARGV[8])
--
-- Reply {code, value} or {6, ms, readers}, with ARGV[3] "1" followed by run_id, uptime_s:
--   code 1  acquired now; value is the new fencing token
--   code 2  the key already held this token (a retried acquire whose first reply was
--           lost): the same grant, its expiry reset to ttl; value is the token already
--           minted (a new one only if the counter was wiped meanwhile)
--   code 0  held by another holder (a plain token, or a reentrant lock's hash); value
--           is its remaining ms (-1: no expiry)
--   code 6  held by a read-write lock's readers: ms until the first of their leases
--           ends, and how many they are
-- A key that holds data fencelock did not write (a semaphore's permits included):
-- wrong_type() (types.lua); nothing written. Everything is checked before the first
-- write: a Lua error after SET would leave the lock set without a token handed out
-- (scripts do not roll back).

-- The common cases come first, before the functions only the others need are defined
-- (the fragments after the marker below: each definition makes a closure on every
-- call): a grant to an attempt that never waited among a read-write lock's writers
-- (ARGV[7] "0": every first attempt, and a plain waiter's later ones), and a refusal by
-- another plain holder. Checks still come before the first write: a bad counter takes
-- no SET.
local counter, bad = read_counter(KEYS[2])

local function reply(code, value, readers)
  if (code == 1 or code == 2) and KEYS[3] and ARGV[4] ~= '' then
    redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[2])
  end
  local out = {code, value, readers}
  if ARGV[3] ~= '1' then
    return out
  end
  local info = redis.call('INFO', 'server')
  out[#out + 1] = string.match(info, 'run_id:(%x+)') or ''
  out[#out + 1] = tonumber(string.match(info, 'uptime_in_seconds:(%d+)') or '0')
  return out
end

-- A listed client's place on the wake list, after an answer: kept after a refusal by a
-- lease with pttl ms left (a grant: nil), for that lease and a margin.
local listed = ARGV[8] and ARGV[8] ~= ''
local margin = listed and tonumber(ARGV[9]) or 0
local function relist(pttl)
  if listed then
    local lasts = math.max(pttl or tonumber(ARGV[2]), 0) + margin
    list_waiter(KEYS[5], ARGV[8], lasts, pttl ~= nil or ARGV[10] == '1', pttl ~= nil and ARGV[11] == '1')
  end
end

local taken = not bad and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if taken and ARGV[7] == '0' then
  relist(nil)
  return reply(1, next_fence(KEYS[2], counter, ARGV[5]))
end
local found = not taken and not bad and redis.pcall('GET', KEYS[1])
if type(found) == 'string' and found ~= ARGV[1] then
  local pttl = redis.call('PTTL', KEYS[1])
  relist(pttl)
  return reply(0, pttl)
end
-- (later fragments)
if bad then
  return wrong_type(KEYS[2], bad)
end

local function granted()
  if ARGV[7] ~= '0' then
    writer_gone(KEYS[4], ARGV[1])
  end
  relist(nil)
  return reply(1, next_fence(KEYS[2], counter, ARGV[5]))
end

if taken then
  return granted()
end

local kind, holder = holder_of(KEYS[1], found)
if kind == 'foreign' and holder == 'readers' then
  local readers, frees_in, bad_writers =
    writer_meets_readers(KEYS[1], KEYS[4], ARGV[1], ARGV[2], ARGV[6] == '1')
  if bad_writers then
    return bad_writers
  elseif readers > 0 then
    return reply(6, frees_in, readers)
  end
  -- Only leases that had ended were left, and the key is gone.
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return granted()
elseif kind == 'foreign' then
  return wrong_type(KEYS[1], holder)
end
if kind == 'plain' and holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  relist(nil)
  if counter == nil then
    -- The counter vanished while we held the lock: our first token is unknowable, so
    -- mint a fresh one, which is higher than any token handed out before.
    return reply(2, next_fence(KEYS[2], counter, ARGV[5]))
  end
  return reply(2, counter)
end
local pttl = redis.call('PTTL', KEYS[1])
relist(pttl)
return reply(0, pttl)
