#!lua
-- write.lua: a fenced write to a resource kept in Redis: the writes are applied,
-- all of them, only with a fencing token at least as high as every token the resource
-- accepted before, and that token is recorded; with a lower token nothing is written.
-- The shebang (no flags) has Redis refuse the script before it starts when the server
-- is out of memory, and every write is checked against the keys' types first: scripts
-- do not roll back, so a write is all or nothing.
--
-- KEYS[1]    the resource's fence: the highest token it accepted, as decimal digits
--            (no expiry)
-- KEYS[2..]  the keys the writes touch, each once
-- ARGV[1]    the token: decimal digits, no leading zero, at most 20 (a u64)
-- ARGV[2..]  the writes, in order, each as: its command, the index in KEYS of its key,
--            how many arguments follow, the arguments:
--              SET     value
--              DEL     (none)
--              INCRBY  increment (an integer, as text)
--              HSET    field value
--              RPUSH   value
--              LPUSH   value
--              XADD    field value [field value ...]   (the entry ID is *)
--              PEXPIRE ms (at least 1)
--
-- Reply, an array:
--   {1, reply of each write...}   accepted: every write applied, the token recorded
--   {0, highest}                  refused: a higher token was accepted (as text);
--                                 nothing written
-- A fence key that holds anything but a token: wrong_type(); nothing written.
-- A write the keys' types would make fail (HSET on a list, INCRBY on a string that
-- is not an integer or past 64 bits): an error reply (WRONGTYPE, or ERR) naming the
-- write and the key; nothing written.

-- Whether decimal token a is lower than b (both canonical: compared as text, exactly,
-- where Lua's numbers would round past 2^53).
local function lower(a, b)
  return #a < #b or (#a == #b and a < b)
end

local token = ARGV[1]
local highest = redis.pcall('GET', KEYS[1])
if type(highest) == 'table' then
  return wrong_type(KEYS[1], redis.call('TYPE', KEYS[1]).ok)
end
if highest then
  if #highest > 20 or not string.match(highest, '^[1-9]%d*$') and highest ~= '0' then
    return wrong_type(KEYS[1], 'string')
  end
  if lower(token, highest) then
    return {0, highest}
  end
end

-- Every write checked, in order, against the types the writes before it leave (a key's
-- type is read only for a write that needs one).
local needs = {HSET = 'hash', RPUSH = 'list', LPUSH = 'list', XADD = 'stream'}
local kinds, values = {}, {}
local function kind_of(key)
  if kinds[key] == nil then
    kinds[key] = redis.call('TYPE', key).ok
  end
  return kinds[key]
end
-- INCRBY's operands: integers of at most 2^62 in magnitude (then the sum fits 64 bits;
-- Lua's numbers cannot tell exactly where past that).
local LIMIT = 4611686018427387904
local function integer(text)
  if type(text) ~= 'string' or #text > 20 or not string.match(text, '^-?%d+$') then
    return nil
  end
  local n = tonumber(text)
  if not n or math.abs(n) >= LIMIT then
    return nil
  end
  return n
end

local writes = {}
local i = 2
while i <= #ARGV do
  local command, key, argc = ARGV[i], KEYS[tonumber(ARGV[i + 1])], tonumber(ARGV[i + 2])
  local args = {}
  for a = 1, argc do
    args[a] = ARGV[i + 2 + a]
  end
  i = i + 3 + argc
  local wanted = needs[command]
  if wanted then
    local found = kind_of(key)
    if found ~= 'none' and found ~= wanted then
      return redis.error_reply('WRONGTYPE fenced write refused, nothing written: ' .. command
        .. ' needs a ' .. wanted .. ' at key ' .. key .. ', which holds a ' .. found)
    end
  end
  if command == 'INCRBY' then
    local current = 0
    if kinds[key] == nil then
      -- Not known yet: one GET tells a string (its value) from an absent key, and a
      -- key of another type by its error.
      local raw = redis.pcall('GET', key)
      if type(raw) == 'table' then
        kinds[key] = redis.call('TYPE', key).ok
      else
        kinds[key], values[key] = raw and 'string' or 'none', raw or nil
      end
    end
    local found = kinds[key]
    if found == 'string' then
      current = integer(values[key])
    elseif found ~= 'none' then
      return redis.error_reply('WRONGTYPE fenced write refused, nothing written: INCRBY '
        .. 'needs an integer at key ' .. key .. ', which holds a ' .. found)
    end
    local by = integer(args[1])
    if not current or not by then
      return redis.error_reply('ERR fenced write refused, nothing written: INCRBY needs '
        .. 'an integer of at most 2^62 in magnitude at key ' .. key .. ' and as increment')
    end
    values[key] = string.format('%d', current + by)
    kinds[key] = 'string'
  elseif command == 'SET' then
    kinds[key], values[key] = 'string', args[1]
  elseif command == 'DEL' then
    kinds[key], values[key] = 'none', nil
  elseif wanted then
    kinds[key] = wanted
  end
  writes[#writes + 1] = {command, key, args}
end

if not highest or lower(highest, token) then
  redis.call('SET', KEYS[1], token)
end
local out = {1}
for w = 1, #writes do
  local command, key, args = writes[w][1], writes[w][2], writes[w][3]
  if command == 'XADD' then
    out[w + 1] = redis.call('XADD', key, '*', unpack(args))
  else
    out[w + 1] = redis.call(command, key, unpack(args))
  end
end
return out
