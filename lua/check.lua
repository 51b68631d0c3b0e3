-- Check every limit of one request, all or nothing.
-- KEYS[i]: the base key of limit i (one hash tag, so all of its keys share a slot).
-- ARGV[1]: now in ms, or "" to use the Redis server clock (the default: gateway clocks may
--          disagree; Redis is the one clock).
-- ARGV[2 + 6(i-1) ..]: algorithm (1-5), limit, window ms, burst, cost, shadow (0/1).
-- Returns 4 integers per limit: allowed, remaining, reset after (ms), retry after (ms);
-- then 1 if the request was admitted (and every admitting limit consumed `cost`), else 0.
local now = tonumber(ARGV[1])
if now then
  SLACK = 60000
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local out, writes, admit = {}, {}, true
for i = 1, #KEYS do
  local a = 2 + (i - 1) * 6
  local alg, limit, w, burst, cost, shadow =
    tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), ARGV[a + 5] == '1'
  local allowed, remaining, reset, retry, write = ALG[alg](KEYS[i], now, limit, w, burst, cost)
  if allowed == 1 then
    writes[#writes + 1] = write
  elseif not shadow then
    admit = false
  end
  local o = (i - 1) * 4
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = allowed, remaining, reset, math.max(retry, allowed == 1 and 0 or 1)
end
if admit then
  for _, write in ipairs(writes) do write() end
end
out[#out + 1] = admit and 1 or 0
return out
