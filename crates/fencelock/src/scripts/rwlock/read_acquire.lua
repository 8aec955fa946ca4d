-- read_acquire.lua: take a read-write lock's read side, as a lease of its own, and mint
-- a fencing token for it, in one round trip. One node only. The layout and the writers'
-- preference: readers.lua.
--
-- KEYS[1]  lock key        readers: a ZSET (readers.lua); a writer: a plain string or
--                          a reentrant lock's hash
-- KEYS[2]  fence counter   plain integer string, as for a lock (fence.lua)
-- KEYS[3]  waiting writers ZSET of writer tokens scored with their deadlines
-- KEYS[4]  wake list       optional, a waiting read's: refused by a writer, it lists '*'
--                          there (kept until the writer's lease ends and ARGV[5] ms
--                          more), so that the writer's release wakes every client
--                          (wakes.lua), not one listed writer's; refused for writers
--                          waiting, the same until the first of their deadlines (the
--                          writer it waits for then holds the lock, and its release,
--                          which publishes nothing when nobody is listed, must wake
--                          the readers)
-- ARGV[1]  holder token    32 lowercase hex digits, fresh for every acquisition
-- ARGV[2]  ttl             milliseconds, a positive integer
-- ARGV[3]  owner id        "" for none. A reader with an owner is the ZSET member
--                          "<token>:<owner>"; it may come in while writers wait if
--                          another reader of its owner holds the lock (its owner would
--                          otherwise wait for a writer that waits for it), and it may
--                          take the read side of its owner's reentrant write lock
-- ARGV[4]  counter idle time, ms ("0": never), as acquire.lua's ARGV[5]
-- ARGV[5]  the listing's margin, ms (with KEYS[4])
--
-- Reply {code, value} or {code, ms, count}, or an integer:
--   an integer  acquired now, nobody holding it or waiting before: the new fencing token
--   code 1  acquired now; value is the new fencing token
--   code 2  the lock already held this reader (a retried acquire whose first reply was
--           lost): the same grant, its lease reset to ttl; value is the token already
--           minted (a new one only if the counter was wiped meanwhile)
--   code 4  the owner holds the write lock (reentrant): the read side is one more hold
--           of it ("hold:<token>" in its hash, released and renewed as a reentrant
--           hold); value is the write lock's fencing token
--   code 0  a writer holds the lock: value is its remaining ms (-1: no expiry)
--   code 5  writers wait for the readers (readers.lua): ms until the first of their
--           deadlines, and how many they are
-- A key of another type (a semaphore's permits included): wrong_type(), nothing
-- written. Everything is checked before the first write.

-- The common case first, before any function is defined (each definition makes a
-- closure on every call): neither a holder nor a waiting writer, a counter of ours. The
-- grant answers a bare integer, its new fencing token (as {1, token}). The counter is
-- read and advanced as fence.lua's read_counter and next_fence do, and the readers'
-- set written as grant() below does (READERS_MARK is holder.lua's), written out here.
local raw = redis.pcall('GET', KEYS[2])
local counted = raw == false
  or (type(raw) == 'string' and #raw <= 18 and string.match(raw, '^%d+$') ~= nil)
if counted and redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = math.max((tonumber(raw) or 0) + 1, now_us)
  if ARGV[4] ~= '0' then
    redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[4])
  else
    redis.call('SET', KEYS[2], string.format('%d', fence))
  end
  local member = ARGV[1]
  if ARGV[3] ~= '' then
    member = ARGV[1] .. ':' .. ARGV[3]
  end
  local ends = math.floor(now_us / 1000) + tonumber(ARGV[2])
  redis.call('ZADD', KEYS[1], ends, member, '+inf', 'rwlock')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return fence
end
-- (later fragments)
local counter, bad = read_counter(KEYS[2])
if bad then
  return wrong_type(KEYS[2], bad)
end
bad = check_types({KEYS[3], 'zset'})
if bad then
  return bad
end
local kind, holder = lock_holder(KEYS[1])
local token, ttl, owner = ARGV[1], tonumber(ARGV[2]), ARGV[3]

if kind == 'reentrant' then
  if owner == '' or holder ~= owner then
    return {0, redis.call('PTTL', KEYS[1])}
  end
  local fence = tonumber(redis.call('HGET', KEYS[1], 'fence'))
  if not fence then
    return wrong_type(KEYS[1], 'hash')
  end
  redis.call('HSET', KEYS[1], 'hold:' .. token, '1')
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {4, fence}
elseif kind == 'plain' then
  local pttl = redis.call('PTTL', KEYS[1])
  if KEYS[4] then
    list_waiter(KEYS[4], '*', math.max(pttl, 0) + tonumber(ARGV[5]), true)
  end
  return {0, pttl}
elseif kind == 'foreign' and holder ~= 'readers' then
  return wrong_type(KEYS[1], holder)
end

local member = token
if owner ~= '' then
  member = token .. ':' .. owner
end
local now = server_ms()

local function grant(code, fence)
  redis.call('ZADD', KEYS[1], now + ttl, member)
  redis.call('ZADD', KEYS[1], '+inf', READERS_MARK)
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return {code, fence}
end

local readers = 0
if kind == 'foreign' then
  readers = readers_held(KEYS[1], now)
  if readers > 0 and redis.call('ZSCORE', KEYS[1], member) then
    if counter == nil then
      return grant(2, next_fence(KEYS[2], counter, ARGV[4]))
    end
    return grant(2, counter)
  end
end

redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if first[1] then
  -- A reader whose owner already reads goes on: its owner would wait for a writer that
  -- waits for it.
  local owner_reads = false
  if owner ~= '' and readers > 0 then
    local suffix = ':' .. owner
    for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
      if #m > #suffix and string.sub(m, -#suffix) == suffix then
        owner_reads = true
        break
      end
    end
  end
  if not owner_reads then
    local frees_in = math.max(tonumber(first[2]) - now, 0)
    if KEYS[4] then
      list_waiter(KEYS[4], '*', frees_in + tonumber(ARGV[5]), true, false, now)
    end
    return {5, frees_in, redis.call('ZCARD', KEYS[3])}
  end
end
return grant(1, next_fence(KEYS[2], counter, ARGV[4]))
