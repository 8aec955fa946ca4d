-- publish.lua: how a script announces a release on a standalone node (or a Sentinel-
-- managed master, or a Redlock node): classic pub/sub. Functions only; a Redis Cluster
-- gets spublish.lua in its place.
--
-- announce(channel, message) -> tells the waiters subscribed to channel; returns how many
--   connections got the message

local function announce(channel, message)
  return redis.call('PUBLISH', channel, message)
end

