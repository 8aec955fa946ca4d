-- fair_release.lua: delete the lock only if it still holds the caller's token, then hand
-- it to the first live waiter in line: the lock goes to that waiter inside this script,
-- with a new fencing token, and the message tells it so; no other waiter is woken.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue     LIST of waiting holder tokens, in arrival order
-- KEYS[3]  waiters   ZSET holder token -> deadline (server ms)
-- KEYS[4]  holder info (deleted with the lock; the next holder's, if it gave one)
-- KEYS[5]  fence counter
-- KEYS[6]  grants    HASH holder token -> "TTL_MS CHANNEL INFO" (fair_acquire.lua)
-- ARGV[1]  holder token
-- ARGV[2]  release channel
-- ARGV[3]  counter idle time, ms (as acquire.lua's ARGV[5])
--
-- The head of the queue gets the lock for its TTL, but no longer than its own deadline
-- to call again: a waiter that crashed since its last call holds up the queue no longer
-- than it would have without the handover. The message, on the channel of the head's
-- client only (CHANNEL: no other client is woken), is "G TOKEN FENCE PX": TOKEN holds
-- the lock now, for PX ms from this script, with fencing token FENCE. A head
-- without a grants entry (a client that does not register one), or a counter of
-- another type, gets the message TOKEN instead: its turn, to take by its own call.
--
-- Reply, an integer:
--    1   released
--    0   not held: the key is absent (the lease expired)
--   -1   not held: another holder has the key
-- A lock key that holds data fencelock did not write: wrong_type(); nothing written. A
-- queue key of another type is left alone: with the queue or the deadlines of another
-- type nobody is woken; with the grants of another type the head is told its turn
-- (TOKEN on the release channel), as a head without a grants entry is.

-- The common case first, before any function is defined (each definition makes a
-- closure on every call): the caller's own lock, and nobody in line (no queue key).
local found = redis.pcall('GET', KEYS[1])
if found == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[4])
  if redis.call('EXISTS', KEYS[2]) == 0 then
    return 1
  end
end
-- (later fragments)
if found ~= ARGV[1] then
  local kind, holder = holder_of(KEYS[1], found)
  if kind == 'foreign' then
    return wrong_type(KEYS[1], holder)
  elseif kind == 'none' then
    return 0
  end
  return -1
end

-- Queue keys are read through redis.pcall: the first read of each (LINDEX,
-- ZRANGEBYSCORE, HGET) checks its type on the way (see the header for keys of another
-- type).
local head = redis.pcall('LINDEX', KEYS[2], 0)
if type(head) ~= 'string' then
  return 1 -- nobody waits (or the queue is not a list)
end
local now, now_us = server_ms_us()
local dead = overdue(KEYS[3], now)
if not dead then
  return 1
end
local wanted = redis.pcall('HGET', KEYS[6], head)
local grants = type(wanted) ~= 'table'
if not grants then
  wanted = nil
end
purge_overdue(KEYS[2], KEYS[3], dead, now, grants and KEYS[6] or nil)
if #dead > 0 then
  head = redis.call('LINDEX', KEYS[2], 0)
  if not head then
    return 1
  end
  wanted = grants and redis.call('HGET', KEYS[6], head)
end
local counter, bad = read_counter(KEYS[5])
if wanted and not bad then
  local ttl, channel, info = string.match(wanted, '^(%d+) (%S+) (.*)$')
  local deadline = tonumber(redis.call('ZSCORE', KEYS[3], head) or '0')
  local px = math.min(tonumber(ttl) or 0, deadline - now)
  if px > 0 then
    redis.call('SET', KEYS[1], head, 'PX', px)
    local fence = next_fence(KEYS[5], counter, ARGV[3], now_us)
    redis.call('LREM', KEYS[2], 0, head)
    redis.call('ZREM', KEYS[3], head)
    redis.call('HDEL', KEYS[6], head)
    if info ~= '' then
      redis.call('SET', KEYS[4], info, 'PX', px)
    end
    announce(channel, 'G ' .. head .. ' ' .. string.format('%d', fence) .. ' ' .. px)
    return 1
  end
end
announce(ARGV[2], head)
return 1
