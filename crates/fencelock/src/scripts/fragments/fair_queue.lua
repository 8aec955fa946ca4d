-- fair_queue.lua: the upkeep of a fair lock's queue of waiters. Functions only.
--
-- purge_waiters(queue, waiters, now, grants) -> removes every waiter whose deadline
--   (server ms) passed (crashed, paused, or gone without leaving) from the queue LIST,
--   the deadline ZSET and the grants HASH (what each waiter asked for, for a release
--   that hands the lock over; nil: none to clean)
-- overdue(waiters, now) -> the waiters whose deadline passed (a list, maybe empty), or
--   nil when the deadline key holds another type than a ZSET: a read that checks the
--   key's type on the way, so a script needs no TYPE call for it
-- purge_overdue(queue, waiters, dead, now, grants) -> as purge_waiters, with the list
--   overdue() returned (read once, by the caller)

local function overdue(waiters, now)
  local dead = redis.pcall('ZRANGEBYSCORE', waiters, '-inf', now)
  if dead.err then
    return nil
  end
  return dead
end

local function purge_overdue(queue, waiters, dead, now, grants)
  for i = 1, #dead do
    redis.call('LREM', queue, 0, dead[i])
    if grants then
      redis.call('HDEL', grants, dead[i])
    end
  end
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now)
  end
end

local function purge_waiters(queue, waiters, now, grants)
  purge_overdue(queue, waiters, redis.call('ZRANGEBYSCORE', waiters, '-inf', now), now, grants)
end
