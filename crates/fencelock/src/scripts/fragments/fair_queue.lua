-- fair_queue.lua: the upkeep of a fair lock's queue of waiters. Functions only.
--
-- purge_waiters(queue, waiters, now, grants) -> removes every waiter whose deadline
--   (server ms) passed (crashed, paused, or gone without leaving) from the queue LIST,
--   the deadline ZSET and the grants HASH (what each waiter asked for, for a release
--   that hands the lock over; nil: none to clean)

local function purge_waiters(queue, waiters, now, grants)
  local dead = redis.call('ZRANGEBYSCORE', waiters, '-inf', now)
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

