-- clock.lua: the server's clock (TIME). Deadlines, due times and token floors come from
-- it, never from a client's clock. Functions only.
--
-- server_us() -> the server clock in microseconds since the Unix epoch
-- server_ms() -> the server clock in milliseconds since the Unix epoch
-- server_ms_us() -> both, from one reading (a script that needs both pays one call)

local function server_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function server_ms_us()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end
-- fence.lua: the fencing counter, read and advanced the same way by every script that
-- grants a lock. Needs clock.lua in front of it. Functions only.
--
-- read_counter(key) -> value, bad_type
--   value: the counter as a number, or nil if the key is absent
--   bad_type: the Redis type found (or "string" for a string that is not an integer of
--   at most 18 digits) when the key holds something fencelock did not write; check it
--   before any write
-- store_counter(key, value, idle_ms) -> stores value in the counter, which then expires
--   after idle_ms without another write (nil, or "0": never). A counter that expired
--   is reseeded from the server clock by next_fence, so tokens keep increasing as long
--   as that clock has not stepped back by more than the idle time since the last grant
-- next_fence(key, value, idle_ms, now_us) -> the new token, stored in the counter (see
--   store_counter): value + 1, and at least the server clock in microseconds (now_us
--   when the caller read it already, or nil). So tokens keep increasing when the counter
--   is lost (FLUSHALL, a restart without persistence) or older than the last grants (a
--   replica promoted after missing them), and tokens minted on different Redlock nodes
--   stay comparable: as long as the server clocks do not step back, and the lock is not
--   granted more than once per microsecond on average

local function read_counter(key)
  local raw = redis.pcall('GET', key)
  if not raw then
    return nil, nil
  elseif type(raw) ~= 'string' then
    -- Another type (WRONGTYPE, counted in INFO errorstats; fencelock never writes one)
    return nil, redis.call('TYPE', key).ok
  end
  if not string.match(raw, '^%d+$') or string.len(raw) > 18 then
    return nil, 'string'
  end
  return tonumber(raw), nil
end

local function store_counter(key, value, idle_ms)
  if idle_ms and idle_ms ~= '0' then
    redis.call('SET', key, string.format('%d', value), 'PX', idle_ms)
  else
    redis.call('SET', key, string.format('%d', value))
  end
end

local function next_fence(key, value, idle_ms, now_us)
  local fence = math.max((value or 0) + 1, now_us or server_us())
  store_counter(key, fence, idle_ms)
  return fence
end

-- waiting.lua: a plain lock's wake list, the waiting side. Functions only; needs
-- clock.lua. wakes.lua has the releasing side and the list's layout.
--
-- list_waiter(list, member, lasts, stays, front, now) -> stays: puts member on the list, at
--   the end of it unless it is there already (its place is kept), or with front at the
--   head of it (a client that a release woke by name, whose attempt another caller
--   beat to the free lock: it is woken first again, not sent to the back behind every
--   client listed since), and keeps the list for at least lasts ms more; otherwise
--   takes member off. now: the server ms, if the caller has it. Errors (a list of
--   another type) are ignored: releases then wake every client, as without a list.

local function list_waiter(list, member, lasts, stays, front, now)
  if not stays then
    redis.pcall('ZREM', list, member)
    return
  end
  if front then
    local head = redis.pcall('ZRANGE', list, 0, 0, 'WITHSCORES')
    local score = type(head) == 'table' and tonumber(head[2])
    redis.pcall('ZADD', list, score and score - 1 or now or server_ms(), member)
  else
    redis.pcall('ZADD', list, 'NX', now or server_ms(), member)
  end
  local left = redis.pcall('PTTL', list)
  if type(left) == 'number' and left < lasts then
    redis.pcall('PEXPIRE', list, lasts)
  end
end
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
--          listed, the list kept for the new lease and ARGV[9] ms)
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
-- types.lua: the one way every script refuses a key that holds data fencelock did not
-- write. Scripts do not roll back, so each checks its keys before its first write and,
-- on a key of another type, returns wrong_type(): an error reply the library turns
-- into Error::WrongType, naming the key and the type found. Functions only.
--
-- wrong_type(key, found) -> the error reply "FENCELOCK-WRONGTYPE <found> <key>"
-- check_types(wanted) -> nil when every key of `wanted` (a list {key, type, key, type,
--   ...}) is absent or of its type; otherwise wrong_type() for the first that is not

local function wrong_type(key, found)
  return redis.error_reply('FENCELOCK-WRONGTYPE ' .. found .. ' ' .. key)
end

local function check_types(wanted)
  for i = 1, #wanted, 2 do
    local found = redis.call('TYPE', wanted[i]).ok
    if found ~= 'none' and found ~= wanted[i + 1] then
      return wrong_type(wanted[i], found)
    end
  end
  return nil
end

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
-- readers.lua: a read-write lock's readers and its waiting writers, the same in every
-- script that meets them. Needs types.lua, holder.lua and clock.lua. Functions only.
--
-- While readers hold a read-write lock its lock key is a ZSET: each reader's member (its
-- holder token, or "<token>:<owner>" for a reader with an owner id) scored with the end
-- of its lease (server ms), and READERS_MARK (holder.lua) scored +inf, which tells it
-- from a semaphore's permits; the key expires with the longest lease. The writer is a
-- plain or reentrant lock on the same key. A writer that finds readers and waits puts
-- its token in the waiting-writers ZSET, scored with a deadline (server ms: its lease
-- from now) that every attempt of it pushes on; while any deadline there is ahead, new
-- readers queue behind the writers (writer preference).
--
-- readers_held(key, now) -> count, frees_in
--   drops the readers whose leases are over, and the key when none is left; how many
--   hold it now, and ms until the first lease ends
-- writer_waits(writers, token, ttl, now)
--   registers the waiting writer `token`, or pushes its deadline on to now + ttl
-- writer_meets_readers(key, writers, token, ttl, join) -> readers, frees_in, bad
--   a writer's acquire that found readers (holder.lua's "readers"): readers_held(), and
--   while some hold it, registers the writer as waiting (writer_waits(), with its ttl)
--   when `join`; bad: the wrong_type() reply of a waiting-writers key of another type
--   (checked before any write). No reader left: the key is gone, the writer may take it
-- writer_gone(writers, token) -> true when this removed the last waiting writer (the
--   readers it held back may go on: announce it). A key of another type, or nil
--   (a caller that passed none), is left alone

local function readers_held(key, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local count = redis.call('ZCARD', key) - 1
  if count <= 0 then
    redis.call('DEL', key)
    return 0, 0
  end
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return count, math.max(tonumber(first[2]) - now, 0)
end

local function writer_waits(writers, token, ttl, now)
  redis.call('ZADD', writers, now + ttl, token)
  if redis.call('PTTL', writers) < ttl then
    redis.call('PEXPIRE', writers, ttl)
  end
end

local function writer_meets_readers(key, writers, token, ttl, join)
  local bad = writers and check_types({writers, 'zset'})
  if bad then
    return 0, 0, bad
  end
  local now = server_ms()
  local readers, frees_in = readers_held(key, now)
  if readers > 0 and writers and join then
    writer_waits(writers, token, tonumber(ttl), now)
  end
  return readers, frees_in, nil
end

local function writer_gone(writers, token)
  if not writers then
    return false
  end
  local removed = redis.pcall('ZREM', writers, token)
  if removed ~= 1 then
    return false
  end
  redis.call('ZREMRANGEBYSCORE', writers, '-inf', server_ms())
  return redis.call('ZCARD', writers) == 0
end
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
