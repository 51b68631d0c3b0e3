-- fixed_window: one counter per window aligned to the Unix epoch.
-- Key: <base>:<window start ms> holds the count, expiring at the window end.
ALG['2'] = function(base, now, limit, w, burst, cost)
  local start = now - now % w
  local key = base .. ':' .. start
  local count = tonumber(redis.call('GET', key) or '0')
  local reset = start + w - now
  if count + cost <= limit then
    return 1, limit - count - cost, reset, 0, COUNTER, key, count, false, start + w - now
  end
  return 0, math.max(limit - count, 0), reset, reset
end
