-- waiting.lua: a plain lock's wake list, the waiting side. Functions only; needs
-- clock.lua. wakes.lua has the releasing side and the list's layout.
--
-- list_waiter(list, member, lasts, stays, front, now) -> stays: puts member on the list, at
--   the end of it unless it is there already (its place is kept), or with front at the
--   head of it (a client that a release woke by name, whose attempt another caller
--   beat to the free lock: it is woken first again, not sent to the back behind every
--   client listed since), and keeps the list for at least lasts ms more; otherwise
--   takes member off, unless it is '*' (which other clients' waiters may have listed:
--   only a release takes it off). now: the server ms, if the caller has it. Errors (a
--   list of another type) are ignored: releases then wake every client, as without a
--   list.

local function list_waiter(list, member, lasts, stays, front, now)
  if not stays then
    if member ~= '*' then
      redis.pcall('ZREM', list, member)
    end
    return
  end
  if front then
    local head = redis.pcall('ZRANGE', list, 0, 0, 'WITHSCORES')
    local score = type(head) == 'table' and tonumber(head[2])
    redis.pcall('ZADD', list, score and score - 1 or now or server_ms(), member)
  else
    redis.pcall('ZADD', list, 'NX', now or server_ms(), member)
  end
  local left = redis.pcall('PTTL', list)
  if type(left) == 'number' and left < lasts then
    redis.pcall('PEXPIRE', list, lasts)
  end
end
