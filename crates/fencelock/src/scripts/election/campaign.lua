-- campaign.lua: one attempt of a campaign in a leader election: take the election's
-- lock key if it is free, mint the new term (the fencing counter), write the leader
-- record and announce the new leader to its followers, in one round trip. On one node
-- (a standalone server, a Sentinel-managed master, a Cluster's master of the name's
-- slot); Redlock clients are refused before anything is sent.
--
-- KEYS[1]  lock key        plain string holding the leader's holder token, with a PX
--                          expiry (a plain lock's key: renewed as one)
-- KEYS[2]  fence counter   the terms: plain integer string, as acquire.lua's KEYS[2]
-- KEYS[3]  leader record   plain string "term=<term> since_ms=<server ms of the grant>
--                          <info>", with the lock key's expiry (the lock's holder info
--                          key: renewed and deleted with the lease)
-- KEYS[4]  wake list       with ARGV[6]: the clients campaigning (wakes.lua)
-- ARGV[1]  holder token    32 lowercase hex digits, fresh for every campaign
-- ARGV[2]  ttl             milliseconds, a positive integer
-- ARGV[3]  what the campaigner says about itself ("" for nothing)
-- ARGV[4]  counter idle time, ms (as acquire.lua's ARGV[5])
-- ARGV[5]  the leader channel: an empty message there tells the followers that the
--          leader changed
-- ARGV[6]  a waiting campaign's client tag (absent or "": none): a refusal lists the
--          client on KEYS[4], as acquire.lua's ARGV[8], so that a resignation wakes it
--          by name
-- ARGV[7]  the listing's margin, ms (ARGV[6])
-- ARGV[8]  "1": the client stays listed after a grant (ARGV[6])
-- ARGV[9]  "1": woken by name since its last attempt: refused, it goes back to the
--          head of the list (ARGV[6])
--
-- Reply {code, value}, as acquire.lua's:
--   code 1  elected now; value is the new term
--   code 2  the key already held this token (a retried attempt whose first reply was
--           lost): the same term, the lease reset to ttl
--   code 0  another campaigner leads; value is its remaining ms (-1: no expiry)
-- A key that holds data a plain lock does not (a reentrant lock's hash, a semaphore's
-- permits, another library's data): wrong_type() (types.lua); nothing written.

local counter, bad = read_counter(KEYS[2])
if bad then
  return wrong_type(KEYS[2], bad)
end

local listed = ARGV[6] and ARGV[6] ~= ''
local function relist(pttl)
  if listed then
    local lasts = math.max(pttl or tonumber(ARGV[2]), 0) + tonumber(ARGV[7])
    list_waiter(KEYS[4], ARGV[6], lasts, pttl ~= nil or ARGV[8] == '1', pttl ~= nil and ARGV[9] == '1')
  end
end

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local now_ms, now_us = server_ms_us()
  local term = next_fence(KEYS[2], counter, ARGV[4], now_us)
  -- string.format: tostring() would write a 16-digit term in exponent form.
  local record = string.format('term=%d since_ms=%d ', term, now_ms) .. ARGV[3]
  redis.call('SET', KEYS[3], record, 'PX', ARGV[2])
  relist(nil)
  announce(ARGV[5], '')
  return {1, term}
end

local kind, holder = lock_holder(KEYS[1], 'plain')
if kind == 'plain' and holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  relist(nil)
  if counter == nil then
    -- The counter vanished while this campaigner led: its term is unknowable, so a
    -- fresh one, higher than any handed out before.
    local term = next_fence(KEYS[2], counter, ARGV[4])
    return {2, term}
  end
  return {2, counter}
elseif kind == 'plain' then
  local pttl = redis.call('PTTL', KEYS[1])
  relist(pttl)
  return {0, pttl}
elseif kind == 'reentrant' then
  return wrong_type(KEYS[1], 'hash')
end
return wrong_type(KEYS[1], holder)
