-- clock.lua: the server's clock (TIME). Deadlines, due times and token floors come from
-- it, never from a client's clock. Functions only.
--
-- server_us() -> the server clock in microseconds since the Unix epoch
-- server_ms() -> the server clock in milliseconds since the Unix epoch
-- server_ms_us() -> both, from one reading (a script that needs both pays one call)

local function server_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function server_ms_us()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end
