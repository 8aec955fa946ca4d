-- wakes.lua: which waiting client a plain release wakes. Functions only; needs
-- clock.lua and publish.lua (or spublish.lua).
--
-- A plain lock's wake list is a ZSET: member, the tag of a client with a waiting
-- acquire; score, the server ms until which it is listed: the end of the lease that
-- refused its last attempt (when it tries again by itself), and a margin. Each refused
-- attempt lists it again (waiting.lua). Readers refused by a writer list '*'.
--
-- wake_next(list, channel) -> announces a release: on the own channel of the client
--   listed the earliest (channel .. ':' .. tag), which it takes off the list, so that
--   one client tries, not one per client. A client that no connection listens for on
--   its own channel (it exited or crashed) is skipped; one that listens but has no
--   waiter left hands the wake on (wake.lua). The release is announced on channel
--   itself, which every waiting client hears, when readers wait ('*'), when nobody live
--   is listed (after a few skipped), or when list is nil or of another type. A client
--   that is listed and hung (stopped, cut off) swallows the wake: the others try again
--   when the lease that refused them would have ended, as without the message.

local function wake_next(list, channel)
  local first = list and redis.pcall('ZRANGE', list, 0, 0, 'WITHSCORES')
  if type(first) == 'table' and first[1] then
    local now = server_ms()
    if tonumber(first[2]) <= now then
      redis.call('ZREMRANGEBYSCORE', list, '-inf', now)
    end
    if redis.call('ZREM', list, '*') == 0 then
      for _ = 1, 4 do
        local tag = redis.call('ZRANGE', list, 0, 0)[1]
        if not tag then
          break
        end
        redis.call('ZREM', list, tag)
        if announce(channel .. ':' .. tag, '') > 0 then
          return
        end
      end
    end
  end
  announce(channel, '')
end
