-- tollgate: take one slot of every concurrency limit of one request, all or nothing.
-- A separate script from the rate-limit check (run with its own EVALSHA).
-- KEYS[i]: the sorted set of limit i and this caller: member = request id, score = when the
--          member's slot was taken (ms, Redis clock).
-- ARGV[1]: the request id, unique across the gateways sharing this Redis.
-- ARGV[2 + 3(i-1) ..]: limit, timeout ms, shadow (0/1) of limit i.
-- Members at least `timeout` old belong to requests that never gave their slot back (the
-- request outlived its timeout, or its gateway died): they are dropped first.
-- The request is admitted when every enforcing limit has a free slot; it then becomes a member
-- of every set with room (a full shadow limit is only reported), and each of those sets expires
-- `timeout` after this take, when all of its members would be stale anyway.
-- Returns 1 if admitted else 0, then the slots in use of each limit before this request.
-- As in check.lua, numbers are converted by arithmetic rather than tonumber, and times (ms,
-- below 1e14) are passed to Redis as Lua prints them, which is exact.
local t = redis.call('TIME')
local us = t[2] + 0
local now = t[1] * 1000 + (us - us % 1000) / 1000
local n = #KEYS
local out, admit = { 0 }, true
for i = 1, n do
  local j = 2 + (i - 1) * 3
  local limit, timeout = ARGV[j] + 0, ARGV[j + 1] + 0
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - timeout)
  local used = redis.call('ZCARD', KEYS[i])
  out[i + 1] = used
  if used >= limit and ARGV[j + 2] ~= '1' then admit = false end
end
if admit then
  out[1] = 1
  for i = 1, n do
    local j = 2 + (i - 1) * 3
    if out[i + 1] < ARGV[j] + 0 then
      redis.call('ZADD', KEYS[i], now, ARGV[1])
      redis.call('PEXPIRE', KEYS[i], ARGV[j + 1])
    end
  end
end
return out
