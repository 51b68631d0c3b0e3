-- Clear one caller's counters of some limits (the admin API's usage reset).
-- KEYS[i]: the base key of limit i. ARGV[i]: its algorithm's code and window ms, "code:w".
-- fixed_window keeps one key per window: the current and the previous one are removed.
-- Returns { how many keys were removed } (a table: the store reads every reply as integers).
local t = redis.call('TIME')
local us = t[2] + 0
local now = t[1] * 1000 + (us - us % 1000) / 1000
local removed = 0
for i = 1, #KEYS do
  local code, w = string.match(ARGV[i], '(%d+):(%d+)')
  if code == '2' then
    w = w + 0
    local start = now - now % w
    removed = removed + redis.call('DEL', KEYS[i] .. ':' .. start, KEYS[i] .. ':' .. (start - w))
  else
    removed = removed + redis.call('DEL', KEYS[i])
  end
end
return { removed }
