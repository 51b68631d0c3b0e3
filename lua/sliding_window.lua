-- sliding_window (default): estimate = prev * (1 - elapsed / w) + cur, scaled by w to stay
-- integral. Keys: <base>:<window start ms>, each expiring one window after its own window.
ALG[1] = function(base, now, limit, w, burst, cost)
  local start = now - now % w
  local cur_key = base .. ':' .. int(start)
  local v = redis.call('MGET', base .. ':' .. int(start - w), cur_key)
  local prev, cur = tonumber(v[1] or '0'), tonumber(v[2] or '0')
  local elapsed = now - start
  local est = prev * (w - elapsed) + cur * w
  local need, capacity = cost * w, limit * w
  if est + need <= capacity then
    return 1, idiv(capacity - est - need, w), 2 * w - elapsed, 0, COUNTER, cur_key, cur, false, start + 2 * w - now
  end
  local to_end = w - elapsed
  local retry
  if cur + cost <= limit then
    retry = to_end - idiv((limit - cur - cost) * w, prev)
  elseif cost <= limit then
    retry = to_end + math.max(w - idiv((limit - cost) * w, cur), 0)
  else
    retry = w
  end
  local reset = to_end
  if cur > 0 then reset = to_end + w end
  return 0, idiv(math.max(capacity - est, 0), w), reset, retry
end
