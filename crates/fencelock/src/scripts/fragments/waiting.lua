-- waiting.lua: a plain lock's wake list, the waiting side. Functions only; needs
-- clock.lua. wakes.lua has the releasing side and the list's layout.
--
-- list_waiter(list, member, lasts, stays) -> stays: puts member on the list, at the end
--   of it unless it is there already (its place is kept), and keeps the list for at
--   least lasts ms more; otherwise takes member off. Errors (a list of another type)
--   are ignored: releases then wake every client, as without a list.

local function list_waiter(list, member, lasts, stays)
  if stays then
    redis.pcall('ZADD', list, 'NX', server_ms(), member)
    local left = redis.pcall('PTTL', list)
    if type(left) == 'number' and left < lasts then
      redis.pcall('PEXPIRE', list, lasts)
    end
  else
    redis.pcall('ZREM', list, member)
  end
end
