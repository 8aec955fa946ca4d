-- inspect.lua: what Redis holds for one lock name, read in one consistent snapshot.
-- Writes nothing.
--
-- KEYS[1]  lock key
-- KEYS[2]  fence counter
-- KEYS[3]  fair queue      LIST of waiting holder tokens
-- KEYS[4]  fair waiters    ZSET holder token -> deadline (server ms)
-- KEYS[5]  holder info
-- KEYS[6]  a semaphore's permit count
-- KEYS[7]  a read-write lock's waiting writers (readers.lua)
-- KEYS[8]  fair grants     HASH holder token -> "TTL_MS CHANNEL INFO" (fair_acquire.lua)
-- KEYS[9]  wake list       ZSET client tag -> server ms when listed (wakes.lua)
-- ARGV[]   none
--
-- Reply, an array:
--   {kind, pttl, holds, owner, counter, info, waiters, permits, permit_leases, writers,
--    waiter_info, listed}
--   kind     "none" (free), "plain" (a holder token), "reentrant" (holds of one owner),
--            "semaphore" (permits held: the lock key is a zset), "readers" (a
--            read-write lock's readers), or the Redis type of data fencelock did not
--            write
--   pttl     the lock key's remaining ms (-1: no expiry, -2: absent)
--   holds    reentrant: how many holds; semaphore: how many permits are held, readers:
--            how many readers (leases not yet over); otherwise 0 (free) or 1
--   owner    reentrant: the owner id; otherwise ""
--   counter  the fencing counter as text (the last token handed out), or "" if absent
--            or not a counter
--   info     what the holder said about itself, or ""
--   waiters  fair mode: {ms left before the waiter is purged, ...} in queue order
--            (only waiters still in the deadline set; -1 for a queued token without one)
--   permits  a semaphore's permit count (0: none stored), also while no permit is held
--            (an idle semaphore: kind "none", the name still a semaphore's)
--   permit_leases  semaphore, readers: {ms left of each lease, ...}, soonest first
--   writers  a read-write lock's writers waiting for its readers (deadlines ahead)
--   waiter_info  fair mode: {what each waiter in `waiters` said about itself, or ""}
--   listed   the wake list, first listed first: {client tag, ms since it was listed,
--            ...} ('*' stands for readers or reentrant owners waiting behind a plain
--            holder); {} when there is none

local kind, holder = lock_holder(KEYS[1])
local pttl = redis.call('PTTL', KEYS[1])
local holds, owner = 0, ''
if kind == 'plain' then
  holds = 1
elseif kind == 'reentrant' then
  owner = holder
  holds = redis.call('HLEN', KEYS[1]) - 2
elseif kind == 'foreign' and holder == 'zset' then
  kind = 'semaphore'
elseif kind == 'foreign' and holder == 'readers' then
  kind = 'readers'
elseif kind == 'foreign' then
  kind = holder
end

local permits, permit_leases = 0, {}
if kind == 'semaphore' or kind == 'readers' then
  local now = server_ms()
  -- "(inf": the readers' mark (scored +inf) is not a lease.
  local held = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '(inf', 'WITHSCORES')
  for i = 2, #held, 2 do
    permit_leases[#permit_leases + 1] = tonumber(held[i]) - now
  end
  holds = #permit_leases
  if holds == 0 then
    kind = 'none'
  end
end
if kind == 'semaphore' or kind == 'none' then
  -- Another type: not a count (0).
  permits = tonumber(redis.pcall('GET', KEYS[6])) or 0
end

local counter, bad = read_counter(KEYS[2], 'any')
local counter_text = ''
if counter ~= nil and not bad then
  counter_text = string.format('%d', counter)
end

local info = ''
if redis.call('TYPE', KEYS[5]).ok == 'string' then
  info = redis.call('GET', KEYS[5])
end

local waiters, waiter_info = {}, {}
if redis.call('TYPE', KEYS[3]).ok == 'list' then
  local now = server_ms()
  local zset = redis.call('TYPE', KEYS[4]).ok == 'zset'
  local grants = KEYS[8] and redis.call('TYPE', KEYS[8]).ok == 'hash'
  for _, token in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
    local deadline = zset and redis.call('ZSCORE', KEYS[4], token)
    if deadline then
      waiters[#waiters + 1] = math.max(0, tonumber(deadline) - now)
    else
      waiters[#waiters + 1] = -1
    end
    local grant = grants and redis.call('HGET', KEYS[8], token)
    waiter_info[#waiter_info + 1] = grant and string.match(grant, '^%S+ %S+ (.*)$') or ''
  end
end

local writers = 0
if KEYS[7] and redis.call('TYPE', KEYS[7]).ok == 'zset' then
  writers = redis.call('ZCOUNT', KEYS[7], '(' .. server_ms(), '+inf')
end

local listed = {}
if KEYS[9] and redis.call('TYPE', KEYS[9]).ok == 'zset' then
  local now = server_ms()
  local wakes = redis.call('ZRANGE', KEYS[9], 0, -1, 'WITHSCORES')
  for i = 1, #wakes, 2 do
    listed[#listed + 1] = wakes[i]
    listed[#listed + 1] = math.max(0, now - tonumber(wakes[i + 1]))
  end
end

return {
  kind, pttl, holds, owner, counter_text, info, waiters, permits, permit_leases, writers,
  waiter_info, listed,
}
