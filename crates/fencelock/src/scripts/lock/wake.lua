-- wake.lua: hand a release's wake on. A client woken by name (wakes.lua) whose waiters
-- had all gone calls this, so that the next listed client (or every client) hears of
-- the release.
--
-- KEYS[1]  the lock's wake list
-- ARGV[1]  the lock's release channel
--
-- Reply: 1.

wake_next(KEYS[1], ARGV[1])
return 1
