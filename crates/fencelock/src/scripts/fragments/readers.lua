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
