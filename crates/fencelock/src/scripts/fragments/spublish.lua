-- spublish.lua: how a script announces a release on a Redis Cluster: sharded pub/sub,
-- which reaches only the nodes of the channel's shard (classic PUBLISH would go to every
-- node of the cluster). The channel shares the lock's hash tag, so it maps to the slot of
-- the keys the script was given. Functions only; in place of publish.lua.
--
-- announce(channel, message) -> tells the waiters subscribed to channel; returns how many
--   connections got the message

local function announce(channel, message)
  return redis.call('SPUBLISH', channel, message)
end

