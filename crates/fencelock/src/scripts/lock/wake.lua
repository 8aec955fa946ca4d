-- wake.lua: hand a release's wake on. A client woken by name (wakes.lua) whose waiters
-- had all gone calls this, so that the next listed client (or every client) hears of
-- the release, unless the lock was taken meanwhile (its holder's release wakes the next).
--
-- KEYS[1]  the lock key
-- KEYS[2]  the lock's wake list
-- ARGV[1]  the lock's release channel
--
-- Reply: 1 if the wake went on, 0 if the lock is held.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
wake_next(KEYS[2], ARGV[1])
return 1
