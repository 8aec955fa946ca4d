-- break.lua: an operator's forced release of a stuck lock, whoever holds it: delete the
-- lock key and its holder info, burn one fencing token so that the next grant is
-- higher than any the evicted holder carries, and wake the waiters.
--
-- KEYS[1]  lock key
-- KEYS[2]  fence counter
-- KEYS[3]  fair queue      LIST of waiting holder tokens
-- KEYS[4]  holder info
-- ARGV[1]  release channel
-- ARGV[2]  counter idle time, ms (as acquire.lua's ARGV[5])
--
-- Reply, an array: {kind, holder, pttl, counter} or, for a semaphore,
-- {kind, holder, pttl, counter, permit_leases}
--   kind     what was broken: "none" (it was free: nothing deleted), "plain",
--            "reentrant", "semaphore" (every permit of it) or "readers" (every reader
--            of a read-write lock; the waiting writers stay)
--   holder   reentrant: the owner id; otherwise ""
--   pttl     the remaining ms of the lease that was broken (-2 when free; a
--            semaphore's key: its longest lease)
--   counter  the fencing counter after the break, as text: every token handed out
--            before is lower ("" when the lock was free and had no counter)
--   permit_leases  semaphore, readers: {ms left of each broken lease, ...}, soonest
--            first (the waiters get one release message per lease)
-- A key that holds data fencelock did not write: wrong_type(); nothing written.

local kind, holder = lock_holder(KEYS[1])
local permit_leases = nil
if kind == 'foreign' and (holder == 'zset' or holder == 'readers') then
  local now = server_ms()
  -- "(inf": the readers' mark (scored +inf) is not a lease.
  local held = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '(inf', 'WITHSCORES')
  permit_leases = {}
  for i = 2, #held, 2 do
    permit_leases[#permit_leases + 1] = tonumber(held[i]) - now
  end
  if #permit_leases == 0 then
    kind = 'none'
  elseif holder == 'zset' then
    kind = 'semaphore'
  else
    kind = 'readers'
  end
elseif kind == 'foreign' then
  return wrong_type(KEYS[1], holder)
end
local counter, bad, marked = read_counter(KEYS[2], 'any')
if bad then
  return wrong_type(KEYS[2], bad)
end
local pttl = redis.call('PTTL', KEYS[1])
if kind == 'none' then
  return {kind, '', pttl, counter and string.format('%d', counter) or ''}
end
if permit_leases then
  local fence = next_fence(KEYS[2], counter, ARGV[2], nil, marked and 's' or nil)
  redis.call('DEL', KEYS[1])
  for _ = 1, #permit_leases do
    announce(ARGV[1], '')
  end
  return {kind, '', pttl, string.format('%d', fence), permit_leases}
end
local fence = next_fence(KEYS[2], counter, ARGV[2])
redis.call('DEL', KEYS[1], KEYS[4])
-- Every waiter: plain and reentrant ones on the empty message, fair ones on their token
-- (the head of the line).
announce(ARGV[1], '')
if redis.call('TYPE', KEYS[3]).ok == 'list' then
  local head = redis.call('LINDEX', KEYS[3], 0)
  if head then
    announce(ARGV[1], head)
  end
end
if kind == 'reentrant' then
  return {kind, holder, pttl, string.format('%d', fence)}
end
return {kind, '', pttl, string.format('%d', fence)}
