-- unlist.lua: take a client off a lock's wake list (wakes.lua): its last waiting
-- acquire of the lock ended without the lock (cancelled, out of time, failed).
--
-- KEYS[1]  the lock's wake list
-- ARGV[1]  the client's tag
--
-- Reply: 1 if it was listed, else 0. A list of another type: 0, nothing written.

local removed = redis.pcall('ZREM', KEYS[1], ARGV[1])
if type(removed) == 'number' then
  return removed
end
return 0
