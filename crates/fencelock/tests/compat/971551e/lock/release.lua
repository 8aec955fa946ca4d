-- publish.lua: how a script announces a release on a standalone node (or a Sentinel-
-- managed master, or a Redlock node): classic pub/sub. Functions only; a Redis Cluster
-- gets spublish.lua in its place.
--
-- announce(channel, message) -> tells the waiters subscribed to channel; returns how many
--   connections got the message

local function announce(channel, message)
  return redis.call('PUBLISH', channel, message)
end

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
-- wakes.lua: which waiting client a release wakes (a plain lock's, a semaphore's).
-- Functions only; needs clock.lua and publish.lua (or spublish.lua).
--
-- A plain lock's wake list is a ZSET: member, the tag of a client with a waiting
-- acquire; score, the server ms when it was listed. A refused attempt of a waiting
-- acquire lists its client (waiting.lua), unless it is listed already; waiters of other
-- kinds that a plain holder refused (readers, reentrant owners) list '*'. The list
-- lives at least as long as the lease that refused its last listing, and a margin (the
-- waiters try again by themselves when that lease ends, and list themselves again).
--
-- wake_next(list, channel) -> announces a release: on the own channel of the client
--   listed first (channel .. ':' .. tag), which it takes off the list, so that one
--   client tries, not one per client. A client that no connection listens for on its
--   own channel (its connections closed: it exited, or crashed with its host up) is
--   taken off and skipped, up to 4 of them; one that listens but has no waiter left
--   hands the wake on (wake.lua). The release is announced on channel itself, which
--   every waiting client hears, when '*' is listed, when nobody live is listed, or when
--   list is nil or of another type. A listed client that is hung (stopped, cut off) or
--   that a pattern subscription stands in for (PSUBSCRIBE on its channel: PUBLISH
--   counts it) swallows the wake: the others try again when the lease that refused
--   them would have ended, as without the message.

local function wake_next(list, channel)
  local first = list and redis.pcall('ZRANGE', list, 0, 0)
  if type(first) == 'table' and first[1] and redis.call('ZREM', list, '*') == 0 then
    local tag = first[1]
    for _ = 1, 4 do
      redis.call('ZREM', list, tag)
      if announce(channel .. ':' .. tag, '') > 0 then
        return
      end
      tag = redis.call('ZRANGE', list, 0, 0)[1]
      if not tag then
        break
      end
    end
  end
  announce(channel, '')
end
-- release.lua: delete a plain lock only if it still holds the caller's token, and tell
-- the waiters. Used on a single node, and on each node of a Redlock release.
--
-- KEYS[1]  lock key
-- KEYS[2]  fence counter
-- KEYS[3]  holder info (deleted with the lock)
-- KEYS[4]  wake list: the clients waiting for the lock (wakes.lua), of which the release
--          wakes one
-- KEYS[5]  waiting writers optional: a read-write lock's (readers.lua); the token leaves
--          it (a writer that gave up waiting), and when it was the last one the readers
--          it held back are woken
-- ARGV[1]  holder token
-- ARGV[2]  release channel: an empty message there (or on one listed client's own
--          channel, wakes.lua) announces the release
-- ARGV[3]  the grant's fencing token (decimal), raised into the counter, whoever holds
--          the key (Redlock: the next grant on any majority gets a higher token); "0":
--          leave the counter alone
-- ARGV[4]  counter idle time, ms, for a raised counter (as acquire.lua's ARGV[5])
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
-- token to raise the counter to), then on a Redlock node.
local found = redis.pcall('GET', KEYS[1])
local own = found == ARGV[1] and not KEYS[5]
if own and ARGV[3] == '0' then
  redis.call('DEL', KEYS[1], KEYS[3])
  wake_next(KEYS[4], ARGV[2])
  return 1
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


local function raise_counter()
  local floor = tonumber(ARGV[3])
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
