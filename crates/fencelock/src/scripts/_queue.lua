-- _queue.lua: the fair queue's upkeep, shared by fair_acquire.lua and fair_release.lua.
-- scripts.rs puts this file in front of each of them when it loads it. It defines
-- functions only.
--
-- KEYS[]   none of its own: the functions take the queue and waiters keys
-- ARGV[]   none
-- Reply    none
--
-- server_ms() -> the server clock in ms (queue deadlines never use client clocks)
-- purge_waiters(queue, waiters, now) -> removes every waiter whose deadline passed
--   (crashed, paused, or gone without leaving) from the queue LIST and the deadline ZSET

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function purge_waiters(queue, waiters, now)
  local dead = redis.call('ZRANGEBYSCORE', waiters, '-inf', now)
  for i = 1, #dead do
    redis.call('LREM', queue, 0, dead[i])
  end
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now)
  end
end

