-- waiting.lua: a plain lock's wake list, the waiting side. Functions only; needs
-- clock.lua. wakes.lua has the releasing side and the list's layout.
--
-- list_waiter(list, member, lasts, stays) -> stays: puts member on the list (or keeps
--   it there) until lasts ms from now; otherwise takes it off. The list lives as long
--   as its longest listing. Errors (a list of another type) are ignored: releases then
--   wake every client, as without a list.

local function list_waiter(list, member, lasts, stays)
  if stays then
    redis.pcall('ZADD', list, server_ms() + lasts, member)
    local left = redis.pcall('PTTL', list)
    if type(left) == 'number' and left < lasts then
      redis.pcall('PEXPIRE', list, lasts)
    end
  else
    redis.pcall('ZREM', list, member)
  end
end
