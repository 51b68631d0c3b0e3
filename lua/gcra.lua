-- gcra: a token bucket kept as one value, the theoretical arrival time (TAT) in microseconds.
-- The emission interval is rounded up to whole microseconds. Key: <base> holds the TAT,
-- expiring when it is reached.
ALG['5'] = function(base, now, limit, w, burst, cost)
  local t = cdiv(w * 1000, limit)
  local now_us = now * 1000
  local tolerance = burst * t
  local tat = now_us
  local v = redis.call('GET', base)
  if v then tat = math.max(tonumber(v), now_us) end
  local new_tat = tat + cost * t
  if new_tat - now_us <= tolerance then
    local ttl = cdiv(new_tat - now_us, 1000)
    return 1, idiv(tolerance - (new_tat - now_us), t), ttl, 0, VALUE, base, int(new_tat), false, math.max(ttl, 1)
  end
  local retry = w
  if cost * t <= tolerance then retry = cdiv(new_tat - now_us - tolerance, 1000) end
  return 0, idiv(math.max(tolerance - (tat - now_us), 0), t), cdiv(tat - now_us, 1000), retry
end
