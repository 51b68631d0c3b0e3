-- Read, without changing anything, how much of each limit one caller has used: the admin
-- API's usage. Each algorithm is asked about a request of cost 0 (which every algorithm
-- admits) and what it would write is dropped.
-- KEYS[i]: the base key of limit i. ARGV[2 + 4(i-1) ..]: algorithm (1-5), limit, window ms,
-- burst. (ARGV[1] is unused, for the same layout as check.lua.)
-- Returns, per limit: remaining, reset after (ms); then the time read at (ms).
local t = redis.call('TIME')
local us = t[2] + 0
local now = t[1] * 1000 + (us - us % 1000) / 1000
local out = {}
for i = 1, #KEYS do
  local j = 2 + (i - 1) * 4
  local _, remaining, reset = ALG[ARGV[j]](KEYS[i], now, ARGV[j + 1] + 0, ARGV[j + 2] + 0, ARGV[j + 3] + 0, 0)
  out[#out + 1] = remaining
  out[#out + 1] = reset
end
out[#out + 1] = now
return out
