-- Check every limit of one request, all or nothing.
-- KEYS[i]: the base key of limit i (one hash tag, so all of its keys share a slot).
-- ARGV[1]: now in ms, or "" to use the Redis server clock (the default: gateway clocks may
--          disagree; Redis is the one clock).
-- ARGV[2 + 6(i-1) ..]: algorithm (1-5), limit, window ms, burst, cost, shadow (0/1).
-- ARGV[1 + 6n + i] (optional, quota leasing): extra units limit i may take beyond `cost`, as a
--          lease the gateway spends locally. A limit that admits takes min(extra, what it has
--          left after `cost`): `remaining` is exact for every algorithm that leases, so the
--          check is repeated for cost + that many and admits.
-- Returns 4 integers per limit: allowed, remaining, reset after (ms), retry after (ms);
-- then 1 if the request was admitted (and every admitting limit consumed `cost`), else 0;
-- then the time decided at (ms), so every gateway reports resets on Redis's clock;
-- then, only when extras were passed, the units each limit leased (0 unless admitted).
-- The integers come as one string, in decimal, separated by spaces, not as an array: the
-- gateway's client parses one value instead of one per integer (about 5k instructions less
-- per call, loadtest/log/2026-11-25-redis-calling-side.md). `%d` truncates toward zero, as
-- Redis does when it turns a Lua number into an integer reply.
-- Numeric arguments are converted by arithmetic (x + 0), which costs Redis about half what a
-- tonumber call does; every one of them is a decimal integer the gateway wrote.
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  local us = t[2] + 0
  now = t[1] * 1000 + (us - us % 1000) / 1000
else
  now = ARGV[1] + 0
  SLACK = 60000
end
local n = #KEYS
local R6, R7 = '%d %d %d %d %d %d', '%d %d %d %d %d %d %d'
local leasing = #ARGV > 1 + 6 * n
-- Defined only for calls that lease: a closure made on every call costs Redis time.
local lease
if leasing then
  -- Take up to `extra` more units than `cost` from limit i, whose check of `cost` admitted with
  -- `remaining` left: the lease and the check's results for cost + lease.
  lease = function(i, extra, cost, remaining, reset, op, key, a, b, ttl)
    local take = math.min(extra + 0, remaining)
    if take <= 0 then return 0, remaining, reset, op, key, a, b, ttl, nil end
    local j = 2 + (i - 1) * 6
    local ok, r2, reset2, _, op2, key2, a2, b2, ttl2 = ALG[ARGV[j]](
      KEYS[i], now, ARGV[j + 1] + 0, ARGV[j + 2] + 0, ARGV[j + 3] + 0, cost + take)
    if ok ~= 1 then return 0, remaining, reset, op, key, a, b, ttl, nil end
    return take, r2, reset2, op2, key2, a2, b2, ttl2, int(cost + take)
  end
end
if n == 1 then
  -- One limit: decide and write in one step.
  local cost = ARGV[6] + 0
  local allowed, remaining, reset, retry, op, key, a, b, ttl = ALG[ARGV[2]](
    KEYS[1], now, ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0, cost)
  if allowed == 1 then
    if leasing and ARGV[8] ~= '0' then
      local took, taken
      took, remaining, reset, op, key, a, b, ttl, taken = lease(1, ARGV[8], cost, remaining, reset, op, key, a, b, ttl)
      apply(op, key, a, b, ttl, now, taken or ARGV[6])
      return string.format(R7, 1, remaining, reset, 0, 1, now, took)
    end
    apply(op, key, a, b, ttl, now, ARGV[6])
    if leasing then return string.format(R7, 1, remaining, reset, 0, 1, now, 0) end
    return string.format(R6, 1, remaining, reset, 0, 1, now)
  end
  local shadow = ARGV[7] == '1' and 1 or 0
  if leasing then return string.format(R7, 0, remaining, reset, math.max(retry, 1), shadow, now, 0) end
  return string.format(R6, 0, remaining, reset, math.max(retry, 1), shadow, now)
end
local out, writes, admit, took = {}, {}, true, {}
for i = 1, n do
  local j = 2 + (i - 1) * 6
  local cost = ARGV[j + 4] + 0
  local allowed, remaining, reset, retry, op, key, a, b, ttl = ALG[ARGV[j]](
    KEYS[i], now, ARGV[j + 1] + 0, ARGV[j + 2] + 0, ARGV[j + 3] + 0, cost)
  took[i] = 0
  if allowed == 1 then
    local taken = ARGV[j + 4]
    local extra = leasing and ARGV[1 + 6 * n + i] or '0'
    if extra ~= '0' then
      local t, t2
      t, remaining, reset, op, key, a, b, ttl, t2 = lease(i, extra, cost, remaining, reset, op, key, a, b, ttl)
      took[i] = t
      if t2 then taken = t2 end
    end
    writes[#writes + 1] = { op, key, a, b, ttl, taken }
    retry = 0
  else
    retry = math.max(retry, 1)
    if ARGV[j + 5] ~= '1' then admit = false end
  end
  local o = (i - 1) * 4
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = allowed, remaining, reset, retry
end
if admit then
  for _, w in ipairs(writes) do apply(w[1], w[2], w[3], w[4], w[5], now, w[6]) end
end
out[n * 4 + 1] = admit and 1 or 0
out[n * 4 + 2] = now
if leasing then
  for i = 1, n do out[n * 4 + 2 + i] = admit and took[i] or 0 end
end
for i = 1, #out do out[i] = string.format('%d', out[i]) end
return table.concat(out, ' ')
