-- token_bucket: capacity `burst`, refilled at limit / w. Tokens are scaled by w so the refill
-- is `limit` per ms. Key: <base> holds "<tokens>:<last ms>", expiring when the bucket is full.
ALG['4'] = function(base, now, limit, w, burst, cost)
  local capacity = burst * w
  local tokens = capacity
  local v = redis.call('GET', base)
  if v then
    local t, last = string.match(v, '^(%d+):(%d+)$')
    local elapsed = math.max(now - tonumber(last), 0)
    tokens = math.min(capacity, tonumber(t) + elapsed * limit)
  end
  local need = cost * w
  if tokens >= need then
    local left = tokens - need
    local reset = cdiv(capacity - left, limit)
    return 1, idiv(left, w), reset, 0, VALUE, base, int(left) .. ':' .. int(now), false, math.max(reset, 1)
  end
  local retry = w
  if need <= capacity then retry = cdiv(need - tokens, limit) end
  return 0, idiv(tokens, w), cdiv(capacity - tokens, limit), retry
end
