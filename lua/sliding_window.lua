-- sliding_window (default): estimate = prev * (1 - elapsed / w) + cur, scaled by w to stay
-- integral. Key: <base>, one hash holding two windows, chosen by the parity of the window
-- number n = floor(now / w): n0/c0 (number, count) for even n, n1/c1 for odd. A count counts
-- only while its number is n (current) or n - 1 (previous), so stale fields need no cleanup.
-- The key expires when the current window stops mattering: one window after it ends.
-- No key names are built and the count is incremented in place: HMGET, then HINCRBY (or, once
-- per window, HSET and PEXPIRE).
ALG['1'] = function(base, now, limit, w, burst, cost)
  local elapsed = now % w
  local n = (now - elapsed) / w
  local nf, cf, pnf, pcf = 'n0', 'c0', 'n1', 'c1'
  if n % 2 == 1 then nf, cf, pnf, pcf = 'n1', 'c1', 'n0', 'c0' end
  local v = redis.call('HMGET', base, nf, cf, pnf, pcf)
  local cur, prev, fresh = 0, 0, n
  if v[1] and v[1] + 0 == n then cur, fresh = v[2] + 0, false end
  if v[3] and v[3] + 0 == n - 1 then prev = v[4] + 0 end
  local est = prev * (w - elapsed) + cur * w
  local need, capacity = cost * w, limit * w
  if est + need <= capacity then
    return 1, idiv(capacity - est - need, w), 2 * w - elapsed, 0, WINDOW, base, cf, fresh, 2 * w - elapsed
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
