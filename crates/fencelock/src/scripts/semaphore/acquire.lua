-- acquire.lua: take one of a semaphore's permits if one is free, as a lease
-- of its own, and mint a fencing token for it, in one round trip. One node only.
-- A fair semaphore (ARGV[5] not "0") serves its waiters in arrival order: a free permit
-- goes to the first waiters of its queue, as many as there are free permits.
--
-- KEYS[1]  permit set      a ZSET: each holder token, scored with its lease's end
--                          (server ms); the key expires with the longest lease
-- KEYS[2]  fence counter   an integer string after an "s" (a semaphore's mark, which
--                          makes a lock refuse the name: fence.lua); an unmarked one
--                          (written before the mark existed) is read too while the
--                          permit count is stored, and rewritten marked
-- KEYS[3]  permit count    plain integer string: how many permits the semaphore has;
--                          expires like the counter, after ARGV[4] without a grant
-- KEYS[4]  queue           fair: LIST of waiting holder tokens, in arrival order
-- KEYS[5]  waiters         fair: ZSET holder token -> deadline (server ms) by which the
--                          waiter must call again, or be purged as crashed (both
--                          expire 2 x the waiter timeout after the last waiter's call)
-- ARGV[1]  holder token    32 lowercase hex digits, fresh for every acquisition
-- ARGV[2]  ttl             milliseconds, a positive integer
-- ARGV[3]  permits         the caller's permit count, a positive integer
-- ARGV[4]  counter idle time, ms ("0": never), for the counter and the permit count
-- ARGV[5]  fair: the waiter timeout, ms; absent or "0": not fair (KEYS[4], KEYS[5]
--          unused)
-- ARGV[6]  fair: "1" to join the queue when it is not our turn; "0": only try
-- ARGV[7]  fair: the release channel, where a message carrying a token wakes that
--          waiter ("" when not fair)
-- KEYS[6]  wake list       not fair, with ARGV[8]: the clients waiting for a permit
--                          (wakes.lua), of which a release wakes one by name
-- ARGV[8]  not fair: a waiting acquire's client tag (absent or "": none): a refusal
--          lists the client on KEYS[6] (unless it is listed: it keeps its place), the
--          list kept until the first lease ends and ARGV[9] ms more; a grant takes it
--          off, unless ARGV[10] is "1" (other waiters of the client wait too); "*":
--          listed as '*', which a grant leaves; as a plain lock's acquire.lua
-- ARGV[9]  the listing's margin, ms (ARGV[8])
-- ARGV[10] "1": the client stays listed after a grant (ARGV[8])
-- ARGV[11] "1": a release woke this client by name since its last attempt: refused,
--          it goes back to the head of the list (ARGV[8])
--
-- Reply {code, value}, {3, ms, permits}, or an integer:
--   an integer  acquired now by the common case below (not fair, not listed): the new
--           fencing token (as {1, token})
--   code 1  acquired now; value is the new fencing token
--   code 2  the set already held this token (a retried acquire whose first reply was
--           lost): the same grant, its lease reset to ttl; value is the token already
--           minted (a new one only if the counter was wiped meanwhile)
--   code 3  every permit is held: ms until the first lease ends, and the permit count
--   code 0  fair: a permit is free, but earlier waiters are first in line (value -2)
-- A permit set of another type (a lock under this name: a string or a hash, or a
-- read-write lock's readers):
-- wrong_type(), nothing written. A lock's counter (unmarked) with no permit count
-- stored: the name is a lock's, free now: wrong_type(KEYS[1], 'lock'), nothing written. A permit count other than ARGV[3] while permits are
-- held, or stored: the error reply "FENCELOCK-PERMITS <count> <asked> <key>", nothing
-- written. Expired permits are dropped first (a crashed holder's permit frees itself
-- after one lease), and in a fair semaphore the waiters that stopped calling. Everything
-- is checked before the first write (a failed read, or the drop of expired permits,
-- which writes nothing when it fails, tells a key of another type).

-- The common case first, before any function is defined (each definition makes a
-- closure on every call): an attempt that neither waits in line nor lists its client
-- (not fair, no ARGV[5]: three keys, four arguments), a marked counter and this
-- caller's permit count both stored (a first grant, or one after they expired, goes
-- the full way below), and a free permit (or the token's own, when a retry finds it
-- there). It reads, answers and writes what the full path does, in fewer commands (an
-- empty set is not trimmed), and answers a new grant with a bare integer, its
-- fencing token ({1, token}); a permit held by every holder is refused here too. The
-- counter is read and advanced as fence.lua's read_counter and next_fence do, written
-- out here.
if not ARGV[5] then
  local raw = redis.pcall('GET', KEYS[2])
  local digits = type(raw) == 'string' and string.match(raw, '^s(%d+)$')
  local held = digits and #digits <= 18 and redis.pcall('GET', KEYS[3]) == ARGV[3]
    and redis.pcall('ZCARD', KEYS[1])
  if type(held) == 'number' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if held > 0 then
      -- Expired permits dropped: a crashed holder's permit frees itself.
      held = held - redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    end
    -- A read-write lock's readers (their mark, holder.lua's READERS_MARK) go the full
    -- way, to be refused.
    if held == 0 or not redis.call('ZSCORE', KEYS[1], 'rwlock') then
      local ttl = tonumber(ARGV[2])
      if held < tonumber(ARGV[3]) then
        local added = redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
        if held == 0 or redis.call('PTTL', KEYS[1]) < ttl then
          redis.call('PEXPIRE', KEYS[1], ttl)
        end
        local idle = ARGV[4] ~= '0'
        if idle then
          redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
        else
          redis.call('SET', KEYS[3], ARGV[3])
        end
        if added == 0 then
          return {2, tonumber(digits)}
        end
        local fence = math.max(tonumber(digits) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
        if idle then
          redis.call('SET', KEYS[2], 's' .. string.format('%d', fence), 'PX', ARGV[4])
        else
          redis.call('SET', KEYS[2], 's' .. string.format('%d', fence))
        end
        return fence
      elseif not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
        local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
        return {3, math.max(tonumber(first[2]) - now, 0), tonumber(ARGV[3])}
      end
    end
  end
end
-- (later fragments)

local timeout = tonumber(ARGV[5] or '0')
local fair = timeout > 0
if fair then
  local bad = check_types({KEYS[4], 'list', KEYS[5], 'zset'})
  if bad then
    return bad
  end
end
local counter, bad_counter, marked = read_counter(KEYS[2], 'semaphore')
if bad_counter then
  return wrong_type(KEYS[2], bad_counter)
end
local asked = tonumber(ARGV[3])
local stored = redis.pcall('GET', KEYS[3])
if type(stored) == 'table' then
  return wrong_type(KEYS[3], redis.call('TYPE', KEYS[3]).ok)
end
if counter and not marked and not stored and redis.call('EXISTS', KEYS[1]) == 0 then
  -- A lock's fencing counter, no permit count, nobody holding: the name is a free
  -- lock's (a held one is refused below, by its key's type).
  return wrong_type(KEYS[1], 'lock')
end
if stored and tonumber(stored) ~= asked then
  return redis.error_reply('FENCELOCK-PERMITS ' .. stored .. ' ' .. ARGV[3] .. ' ' .. KEYS[1])
end

local now, now_us = server_ms_us()
local ttl = tonumber(ARGV[2])
if type(redis.pcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)) == 'table' then
  return wrong_type(KEYS[1], redis.call('TYPE', KEYS[1]).ok)
end
local held = redis.call('ZCARD', KEYS[1])
if held > 0 and redis.call('ZSCORE', KEYS[1], READERS_MARK) then
  return wrong_type(KEYS[1], 'readers') -- a read-write lock's readers
end

-- The client's place on the wake list after an answer (not fair): kept after a refusal
-- until the first lease ends (frees_in ms) and the margin; after a grant (nil) only if
-- its other waiters still wait.
local listed = not fair and ARGV[8] and ARGV[8] ~= ''
local function relist(frees_in)
  if listed then
    local lasts = math.max(frees_in or ttl, 0) + tonumber(ARGV[9])
    list_waiter(KEYS[6], ARGV[8], lasts, frees_in ~= nil or ARGV[10] == '1',
      frees_in ~= nil and ARGV[11] == '1', now)
  end
end

-- The permit's lease starts; the set expires with its longest lease (a new set: with
-- this one). Returns whether the token was already there (a retried acquire).
local function lease(held)
  local added = redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  if held == 0 or redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return added == 0
end

-- Everything a grant writes after its lease.
local function granted(code, fence)
  store_counter(KEYS[3], asked, ARGV[4])
  if fair then
    redis.call('LREM', KEYS[4], 0, ARGV[1])
    redis.call('ZREM', KEYS[5], ARGV[1])
  end
  relist(nil)
  return {code, fence}
end

local function mint()
  return next_fence(KEYS[2], counter, ARGV[4], now_us, 's')
end

if not fair and held < asked then
  -- The common case: a free permit (or the token's own, when a retry finds it there).
  if lease(held) then
    return granted(2, counter or mint())
  end
  return granted(1, mint())
end
if fair then
  purge_waiters(KEYS[4], KEYS[5], now, nil)
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  lease(held)
  return granted(2, counter or mint())
end
local free = asked - held
if free > 0 then
  -- Fair: our turn if fewer waiters than free permits are ahead of us.
  local ahead = redis.call('LPOS', KEYS[4], ARGV[1]) or redis.call('LLEN', KEYS[4])
  if ahead < free then
    lease(held)
    return granted(1, mint())
  end
end
if fair and ARGV[6] == '1' then
  if not redis.call('ZSCORE', KEYS[5], ARGV[1]) then
    redis.call('RPUSH', KEYS[4], ARGV[1])
  end
  redis.call('ZADD', KEYS[5], now + timeout, ARGV[1])
  for _, key in ipairs({KEYS[4], KEYS[5]}) do
    if redis.call('PTTL', key) < 2 * timeout then
      redis.call('PEXPIRE', key, 2 * timeout)
    end
  end
end
if free > 0 then
  -- Free permits, and other waiters' turn: make sure they know, in case they missed
  -- a message.
  for _, head in ipairs(redis.call('LRANGE', KEYS[4], 0, free - 1)) do
    announce(ARGV[7], head)
  end
  return {0, -2}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local frees_in = math.max(tonumber(first[2]) - now, 0)
relist(frees_in)
return {3, frees_in, asked}
