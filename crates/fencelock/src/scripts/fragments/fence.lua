-- fence.lua: the fencing counter, read and advanced the same way by every script that
-- grants a lock. Needs clock.lua in front of it. Functions only.
--
-- read_counter(key, semaphore) -> value, bad_type, marked
--   value: the counter as a number, or nil if the key is absent
--   bad_type: the Redis type found (or "string" for a string that is not an integer of
--   at most 18 digits) when the key holds something fencelock did not write; check it
--   before any write. A semaphore's counter is marked: its digits follow an "s" (so
--   that a lock, whose scripts read the counter anyway, refuses a semaphore's name
--   while no permit is held at no extra cost). Without `semaphore` (every lock script)
--   a marked counter is bad_type "semaphore"; with it ("semaphore": the semaphore's
--   scripts, "any": break and inspect) it is read, and marked is true
-- store_counter(key, value, idle_ms, mark) -> stores value in the counter (after `mark`,
--   "s" for a semaphore's, or nil), which then expires
--   after idle_ms without another write (nil, or "0": never). A counter that expired
--   is reseeded from the server clock by next_fence, so tokens keep increasing as long
--   as that clock has not stepped back by more than the idle time since the last grant
-- next_fence(key, value, idle_ms, now_us, mark) -> the new token, stored in the counter
--   (see store_counter): value + 1, and at least the server clock in microseconds (now_us
--   when the caller read it already, or nil). So tokens keep increasing when the counter
--   is lost (FLUSHALL, a restart without persistence) or older than the last grants (a
--   replica promoted after missing them), and tokens minted on different Redlock nodes
--   stay comparable: as long as the server clocks do not step back, and the lock is not
--   granted more than once per microsecond on average

local function read_counter(key, semaphore)
  local raw = redis.pcall('GET', key)
  if not raw then
    return nil, nil, false
  elseif type(raw) ~= 'string' then
    -- Another type (WRONGTYPE, counted in INFO errorstats; fencelock never writes one)
    return nil, redis.call('TYPE', key).ok, false
  end
  if string.match(raw, '^%d+$') and string.len(raw) <= 18 then
    return tonumber(raw), nil, false
  end
  local digits = string.match(raw, '^s(%d+)$')
  if not digits or string.len(digits) > 18 then
    return nil, 'string', false
  elseif not semaphore then
    return nil, 'semaphore', true
  end
  return tonumber(digits), nil, true
end

local function store_counter(key, value, idle_ms, mark)
  local text = (mark or '') .. string.format('%d', value)
  if idle_ms and idle_ms ~= '0' then
    redis.call('SET', key, text, 'PX', idle_ms)
  else
    redis.call('SET', key, text)
  end
end

local function next_fence(key, value, idle_ms, now_us, mark)
  local fence = math.max((value or 0) + 1, now_us or server_us())
  store_counter(key, fence, idle_ms, mark)
  return fence
end

