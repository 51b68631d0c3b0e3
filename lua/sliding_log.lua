-- sliding_log: exact. A sorted set of admitted requests, score = time (ms), member =
-- "<time>:<cost>" (requests in the same millisecond are merged into one member).
ALG['3'] = function(base, now, limit, w, burst, cost)
  redis.call('ZREMRANGEBYSCORE', base, '-inf', int(now - w))
  local entries = redis.call('ZRANGE', base, 0, -1)
  local used, costs, times = 0, {}, {}
  for i, m in ipairs(entries) do
    local ts, c = string.match(m, '^(%d+):(%d+)$')
    times[i], costs[i] = tonumber(ts), tonumber(c)
    used = used + costs[i]
  end
  local n = #entries
  if used + cost <= limit then
    -- Requests in the same millisecond share one member: replace it with the summed cost.
    if n > 0 and times[n] == now then
      return 1, limit - used - cost, w, 0, LOG, base, entries[n], costs[n] + cost, w
    end
    return 1, limit - used - cost, w, 0, LOG, base, false, cost, w
  end
  local last = now
  if n > 0 then last = times[n] end
  local reset = last + w - now
  local retry = w
  if cost <= limit then
    retry = reset
    local freed = 0
    for i = 1, n do
      freed = freed + costs[i]
      if used - freed + cost <= limit then
        retry = times[i] + w - now
        break
      end
    end
  end
  return 0, math.max(limit - used, 0), reset, retry
end
