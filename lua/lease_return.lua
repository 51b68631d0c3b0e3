-- Give back the units of quota leases a gateway did not spend (appended to prelude.lua).
-- KEYS[i]: the base key of limit i. ARGV[1 + 5(i-1) ..]: algorithm (2, 1, 4 or 5), limit,
-- window ms, burst, units, and the lease's window (fixed_window: its start ms;
-- sliding_window: its number floor(now / w); otherwise 0), so ARGV has 6 values per key.
-- A window lease's units are given back only while its window is still the current one: units
-- returned after the boundary are dropped, never credited to the next window. A bucket gets
-- its tokens back up to its capacity (gcra: its TAT moves back, never before now).
-- Returns { units given back, units dropped }.
local t = redis.call('TIME')
local us = t[2] + 0
local now = t[1] * 1000 + (us - us % 1000) / 1000
local back, dropped = 0, 0
for i = 1, #KEYS do
  local j = 1 + (i - 1) * 6
  local code, limit, w, burst = ARGV[j], ARGV[j + 1] + 0, ARGV[j + 2] + 0, ARGV[j + 3] + 0
  local units, win = ARGV[j + 4] + 0, ARGV[j + 5] + 0
  local given = 0
  if code == '2' then
    local key = KEYS[i] .. ':' .. int(win)
    if now - now % w == win then
      local count = tonumber(redis.call('GET', key) or '0')
      given = math.min(units, count)
      if given > 0 then redis.call('DECRBY', key, int(given)) end
    end
  elseif code == '1' then
    local n = (now - now % w) / w
    if n == win then
      local nf, cf = 'n0', 'c0'
      if n % 2 == 1 then nf, cf = 'n1', 'c1' end
      local v = redis.call('HMGET', KEYS[i], nf, cf)
      if v[1] and v[1] + 0 == n then
        given = math.min(units, v[2] + 0)
        if given > 0 then redis.call('HINCRBY', KEYS[i], cf, -given) end
      end
    end
  elseif code == '4' then
    local v = redis.call('GET', KEYS[i])
    if v then
      local capacity = burst * w
      local tk, last = string.match(v, '^(%d+):(%d+)$')
      local tokens = math.min(capacity, tonumber(tk) + math.max(now - tonumber(last), 0) * limit)
      local left = math.min(capacity, tokens + units * w)
      given = idiv(left - tokens, w)
      local ttl = cdiv(capacity - left, limit)
      if ttl > 0 then
        redis.call('SET', KEYS[i], int(left) .. ':' .. int(now), 'PX', int(ttl + SLACK))
      else
        redis.call('DEL', KEYS[i])
      end
    end
  elseif code == '5' then
    local v = redis.call('GET', KEYS[i])
    if v then
      local tu = cdiv(w * 1000, limit)
      local now_us = now * 1000
      local tat = tonumber(v)
      local back_to = math.max(tat - units * tu, now_us)
      given = idiv(tat - back_to, tu)
      if back_to > now_us then
        redis.call('SET', KEYS[i], int(back_to), 'PX', int(cdiv(back_to - now_us, 1000) + SLACK))
      else
        redis.call('DEL', KEYS[i])
      end
    end
  end
  back = back + given
  dropped = dropped + units - given
end
return { back, dropped }
