-- _counter.lua: the fencing counter, shared by every acquire script. scripts.rs puts this
-- file in front of each of them when it loads it, so all read and advance the counter
-- the same way. It defines functions only.
--
-- KEYS[]   none of its own: the functions take the counter key
-- ARGV[]   none
-- Reply    none
--
-- read_counter(key) -> value, bad_type
--   value: the counter as a number, or nil if the key is absent
--   bad_type: the Redis type found (or "string" for a non-integer string) when the key
--   holds something fencelock did not write; check it before any write, since scripts
--   do not roll back
-- next_fence(key, value) -> the new token
--   advances the counter by one; a missing counter (first use, FLUSHALL, a restart
--   without persistence) is seeded from the server clock in microseconds, so tokens keep
--   increasing across a wipe unless the lock was granted more than once per
--   microsecond on average

local function read_counter(key)
  local kind = redis.call('TYPE', key).ok
  if kind == 'none' then
    return nil, nil
  elseif kind ~= 'string' then
    return nil, kind
  end
  local raw = redis.call('GET', key)
  if not string.match(raw, '^%d+$') or string.len(raw) > 18 then
    return nil, 'string'
  end
  return tonumber(raw), nil
end

local function next_fence(key, value)
  if value == nil then
    local t = redis.call('TIME')
    redis.call('SET', key, t[1] .. string.format('%06d', tonumber(t[2])))
  end
  return redis.call('INCR', key)
end

