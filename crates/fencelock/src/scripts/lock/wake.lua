-- wake.lua: hand a release's wake on. A client woken by name (wakes.lua) whose waiters
-- had all gone calls this, so that the next listed client (or every client) hears of
-- the release, unless the lock was taken meanwhile (its holder's release wakes the next).
--
-- KEYS[1]  the lock key: a lock, or a semaphore's permit set
-- KEYS[2]  the wake list
-- KEYS[3]  a semaphore's permit count
-- ARGV[1]  the release channel
--
-- Reply: 1 if the wake went on, 0 if the lock is held (a semaphore: every permit, or
-- no permit count is stored).

local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'zset' then
  local permits = tonumber(redis.pcall('GET', KEYS[3]))
  local held = redis.call('ZCOUNT', KEYS[1], '(' .. server_ms(), '+inf')
  if not permits or held >= permits then
    return 0
  end
elseif kind ~= 'none' then
  return 0
end
wake_next(KEYS[2], ARGV[1])
return 1
