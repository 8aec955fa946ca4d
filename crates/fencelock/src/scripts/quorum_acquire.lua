-- quorum_acquire.lua: one node's part of a Redlock acquire. Like acquire.lua, and it also
-- tells who the node is, for restart protection, and keeps its counter at or above the
-- server clock, so tokens minted on different nodes stay comparable.
--
-- KEYS[1]  lock key        plain string holding the owner token, with a PX expiry
-- KEYS[2]  fence counter   plain integer string, never expires
-- ARGV[1]  owner token
-- ARGV[2]  ttl, ms
-- ARGV[3]  "1": report run_id and uptime (restart protection is on); "0": skip INFO
--
-- Reply, an array: {code, value, run_id, uptime_s}
--   code 1: acquired now, value = fence (max(counter + 1, server time in us))
--   code 2: the key already held this token (a retry), value = the counter
--   code 0: held by another owner, value = pttl (-1: no expiry)
--   {-1, key, type}: a key holds something fencelock did not write; nothing written
-- run_id and uptime_s come from INFO server ('' and 0 when ARGV[3] is "0"): a node that restarted recently may have lost
-- the keys it held, and must not vote until every lease it held has run out.

local run_id, uptime = '', 0
if ARGV[3] == '1' then
  local info = redis.call('INFO', 'server')
  run_id = string.match(info, 'run_id:(%x+)') or ''
  uptime = tonumber(string.match(info, 'uptime_in_seconds:(%d+)') or '0')
end

-- read_counter comes from _counter.lua, loaded in front of this file.
local counter, bad = read_counter(KEYS[2])
if bad then
  return {-1, KEYS[2], bad}
end
counter = counter or 0

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = math.max(counter + 1, now_us)
  redis.call('SET', KEYS[2], string.format('%d', fence))
  return {1, fence, run_id, uptime}
end

local lock_type = redis.call('TYPE', KEYS[1]).ok
if lock_type == 'hash' and redis.call('HEXISTS', KEYS[1], 'owner') == 1 then
  return {0, redis.call('PTTL', KEYS[1]), run_id, uptime}
elseif lock_type ~= 'string' then
  return {-1, KEYS[1], lock_type}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {2, counter, run_id, uptime}
end
return {0, redis.call('PTTL', KEYS[1]), run_id, uptime}
