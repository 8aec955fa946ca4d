-- publish.lua: how a script announces a release on a standalone node (or a Sentinel-
-- managed master, or a Redlock node): classic pub/sub. Functions only; a Redis Cluster
-- gets spublish.lua in its place.
--
-- announce(channel, message): tell the waiters subscribed to channel

local function announce(channel, message)
  redis.call('PUBLISH', channel, message)
end

