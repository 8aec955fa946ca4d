-- fair_queue.lua: the upkeep of a fair lock's queue of waiters. Functions only.
--
-- purge_waiters(queue, waiters, now) -> removes every waiter whose deadline (server ms)
--   passed (crashed, paused, or gone without leaving) from the queue LIST and the
--   deadline ZSET

local function purge_waiters(queue, waiters, now)
  local dead = redis.call('ZRANGEBYSCORE', waiters, '-inf', now)
  for i = 1, #dead do
    redis.call('LREM', queue, 0, dead[i])
  end
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now)
  end
end

