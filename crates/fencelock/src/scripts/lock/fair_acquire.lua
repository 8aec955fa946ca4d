-- fair_acquire.lua: take the lock in arrival order, or join (and stay in) the queue.
--
-- KEYS[1]  lock key        plain string holding the holder token, with a PX expiry
-- KEYS[2]  fence counter   plain integer string, expiring after ARGV[8] without a grant
-- KEYS[3]  queue           LIST of waiting holder tokens, in arrival order
-- KEYS[4]  waiters         ZSET holder token -> deadline (server ms) by which the waiter
--                          must call again, or be purged as crashed
--                          (both expire 1.5 to 2 x the waiter timeout after the last
--                          call of a waiter, unless a later call of another waiter
--                          extends them)
-- KEYS[5]  holder info     plain string, with the lock key's expiry (when ARGV[6] is
--                          not empty)
-- KEYS[6]  grants          HASH holder token -> "TTL_MS CHANNEL INFO": what each queued
--                          waiter asked for and where its client listens, so that a
--                          release can hand the lock straight to the head of the queue
--                          (fair_release.lua); expires with the queue
-- ARGV[1]  holder token
-- ARGV[2]  ttl, ms
-- ARGV[3]  waiter timeout, ms: how long a queued waiter may stay silent
-- ARGV[4]  release channel: a message carrying a token wakes that waiter
-- ARGV[5]  "1": join the queue when it is not our turn; "0": only try
-- ARGV[6]  holder info, or "" for none
-- ARGV[7]  the waiter's client's own release channel (no spaces): where a release that
--          hands it the lock says so
-- ARGV[8]  counter idle time, ms (as acquire.lua's ARGV[5])
-- KEYS[7]  wake list       optional, a waiting acquire's: refused by a holder of a
--                          plain string (a fair holder, or a plain lock's of the same
--                          name) while first in line (only the head can take a free
--                          lock), it lists '*' there (kept until that lease ends and
--                          ARGV[9] ms more), so that a plain holder's release, which
--                          publishes nothing when nobody is listed, wakes every client
--                          (wakes.lua)
-- ARGV[9]  the listing's margin, ms (with KEYS[7])
--
-- Reply:
--   an integer        acquired now, nobody holding it or in line: the new fencing token
--   {1, fence}        acquired now
--   {2, fence}        the key already held this token (a retried acquire)
--   {0, pttl, fence}  not acquired: held by another holder (pttl ms left, -1 for no
--                     expiry), or free but another waiter is first in line (pttl -2);
--                     fence: the counter now (0 if none), so the caller can tell a
--                     handover that came after this answer (a higher token) from one
--                     that came before it
--   {0, pttl}         held by a reentrant holder
-- A key that holds data fencelock did not write: wrong_type(); nothing written.
--
-- Deadlines come from the server's clock (TIME), never from the clients'. Every check
-- happens before the first write: scripts do not roll back.

-- The common case first, before any function is defined (each definition makes a
-- closure on every call): a free lock that nobody waits for (none of its keys but the
-- counter and the holder info exists) and a counter of ours: the grant (as below, with
-- nothing to leave in line) answers a bare integer, its new fencing token (as {1,
-- token}). The counter is read and advanced as fence.lua's read_counter and next_fence
-- do, written out here.
local raw = redis.pcall('GET', KEYS[2])
local counted = raw == false
  or (type(raw) == 'string' and #raw <= 18 and string.match(raw, '^%d+$') ~= nil)
if counted and redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4], KEYS[6]) == 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if ARGV[6] ~= '' then
    redis.call('SET', KEYS[5], ARGV[6], 'PX', ARGV[2])
  end
  local t = redis.call('TIME')
  local fence = math.max((tonumber(raw) or 0) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
  if ARGV[8] and ARGV[8] ~= '0' then
    redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[8])
  else
    redis.call('SET', KEYS[2], string.format('%d', fence))
  end
  return fence
end
-- (later fragments)
local kind, holder = lock_holder(KEYS[1], 'plain')
if kind == 'reentrant' then
  return {0, redis.call('PTTL', KEYS[1])} -- a reentrant holder: not ours to queue behind
elseif kind == 'foreign' then
  return wrong_type(KEYS[1], holder)
end
-- Each key's type is checked before the first write, by the first read of it that the
-- script needs anyway where there is one (LINDEX, ZRANGEBYSCORE), by TYPE where not.
local head = redis.pcall('LINDEX', KEYS[3], 0)
if type(head) == 'table' then
  return wrong_type(KEYS[3], redis.call('TYPE', KEYS[3]).ok)
end
local bad = check_types({KEYS[6], 'hash'})
if bad then
  return bad
end
local counter, bad_counter = read_counter(KEYS[2])
if bad_counter then
  return wrong_type(KEYS[2], bad_counter)
end
local now, now_us = server_ms_us()
local dead = overdue(KEYS[4], now)
if not dead then
  return wrong_type(KEYS[4], redis.call('TYPE', KEYS[4]).ok)
end
purge_overdue(KEYS[3], KEYS[4], dead, now, KEYS[6])
if #dead > 0 then
  head = redis.call('LINDEX', KEYS[3], 0)
end

local function on_grant() -- leave the queue, describe the holder
  redis.call('LREM', KEYS[3], 0, ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[6], ARGV[1])
  if ARGV[6] ~= '' then
    redis.call('SET', KEYS[5], ARGV[6], 'PX', ARGV[2])
  end
end

if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  on_grant()
  if counter == nil then
    return {2, next_fence(KEYS[2], counter, ARGV[8], now_us)}
  end
  return {2, counter}
end

if kind == 'none' and (not head or head == ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  on_grant()
  return {1, next_fence(KEYS[2], counter, ARGV[8], now_us)}
end

if ARGV[5] == '1' then
  local timeout = tonumber(ARGV[3])
  -- A new member of the deadlines joins the end of the queue; one already there keeps
  -- its place.
  if redis.call('ZADD', KEYS[4], now + timeout, ARGV[1]) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[1])
  end
  redis.call('HSET', KEYS[6], ARGV[1], ARGV[2] .. ' ' .. ARGV[7] .. ' ' .. ARGV[6])
  -- The queue outlives every live waiter's deadline, and goes by itself once the last
  -- waiter stopped calling (crashed) even if nobody calls a fair script again: after
  -- this call each key has at least one and a half timeouts left (set to twice the
  -- timeout when less was left, so that most calls only read the expiry).
  for _, key in ipairs({KEYS[3], KEYS[4], KEYS[6]}) do
    if redis.call('PTTL', key) < timeout * 3 / 2 then
      redis.call('PEXPIRE', key, 2 * timeout)
    end
  end
end

if kind == 'none' then
  -- Free, and another waiter's turn: make sure it knows, in case it missed a message.
  announce(ARGV[4], head)
  return {0, -2, counter or 0}
end
-- (later fragments)
local pttl = redis.call('PTTL', KEYS[1])
if KEYS[7] and (not head or head == ARGV[1]) then
  list_waiter(KEYS[7], '*', math.max(pttl, 0) + tonumber(ARGV[9]), true, false, now)
end
return {0, pttl, counter or 0}
