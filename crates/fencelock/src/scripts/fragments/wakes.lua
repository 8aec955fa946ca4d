-- wakes.lua: which waiting client a release wakes (a plain lock's, a semaphore's).
-- Functions only; needs clock.lua and publish.lua (or spublish.lua).
--
-- A plain lock's wake list is a ZSET: member, the tag of a client with a waiting
-- acquire; score, the server ms when it was listed. A refused attempt of a waiting
-- acquire lists its client (waiting.lua), unless it is listed already; waiters that a
-- release can only reach on the lock's channel list '*': those of other kinds that a
-- plain holder refused (readers, reentrant owners, fair waiters) and plain or semaphore
-- waiters whose client's own channel is not subscribed on every node. The list lives
-- at least as long as the lease that refused its last listing, and a margin (the
-- waiters try again by themselves when that lease ends, and list themselves again).
--
-- wake_next(list, channel) -> whether it announced the release: on the own channel of
--   the client listed first (channel .. ':' .. tag), which it takes off the list, so
--   that one client tries, not one per client. A client that no connection listens
--   for on its own channel (its connections closed: it exited, or crashed with its
--   host up) is taken off and skipped, up to 4 of them; one that listens but has no
--   waiter left hands the wake on (wake.lua). The release is announced on channel
--   itself, which every waiting client hears, when '*' is listed, when nobody live is
--   listed, or when list is nil or of another type. When list is absent (nobody is
--   listed, so nobody waits: every waiter lists itself), nothing is announced: an
--   uncontended release publishes nothing. A listed client that is hung (stopped, cut
--   off) or that a pattern subscription stands in for (PSUBSCRIBE on its channel:
--   PUBLISH counts it) swallows the wake, and so does a waiter that does not list
--   itself (a client of a version before the list): the others try again when the
--   lease that refused them would have ended, as without the message.

local function wake_next(list, channel)
  local first = list and redis.pcall('ZRANGE', list, 0, 0)
  if type(first) == 'table' and not first.err then
    if not first[1] then
      return false
    end
    if redis.call('ZREM', list, '*') == 0 then
      local tag = first[1]
      for _ = 1, 4 do
        redis.call('ZREM', list, tag)
        if announce(channel .. ':' .. tag, '') > 0 then
          return true
        end
        tag = redis.call('ZRANGE', list, 0, 0)[1]
        if not tag then
          break
        end
      end
    end
  end
  announce(channel, '')
  return true
end
