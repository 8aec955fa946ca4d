-- types.lua: the one way every script refuses a key that holds data fencelock did not
-- write. Scripts do not roll back, so each checks its keys before its first write and,
-- on a key of another type, returns wrong_type(): an error reply the library turns
-- into Error::WrongType, naming the key and the type found. Functions only.
--
-- wrong_type(key, found) -> the error reply "FENCELOCK-WRONGTYPE <found> <key>"
-- check_types(wanted) -> nil when every key of `wanted` (a list {key, type, key, type,
--   ...}) is absent or of its type; otherwise wrong_type() for the first that is not

local function wrong_type(key, found)
  return redis.error_reply('FENCELOCK-WRONGTYPE ' .. found .. ' ' .. key)
end

local function check_types(wanted)
  for i = 1, #wanted, 2 do
    local found = redis.call('TYPE', wanted[i]).ok
    if found ~= 'none' and found ~= wanted[i + 1] then
      return wrong_type(wanted[i], found)
    end
  end
  return nil
end

