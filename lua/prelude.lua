-- tollgate: shared helpers. The scripts in this directory are concatenated, in the order
-- prelude, algorithms, check, into the one script the gateway runs with EVALSHA; each
-- algorithm file adds one entry to ALG. Every number stays below 2^53 (validation bounds
-- limit x window), so Lua's doubles are exact; integers are written back with %d because
-- Lua would print large ones in exponent form.
local ALG = {}

-- Extra lifetime (ms) of every key. 0 in production: keys live exactly as long as their state
-- matters. When a caller passes its own time (tests replaying sequences) that time does not
-- advance with Redis's clock, so keys get a minute of slack; a key kept past its expiry is
-- harmless because every algorithm treats expired state like no state.
local SLACK = 0

-- floor(a / b) for non-negative integers, exact even where a / b rounds.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- ceil(a / b) for non-negative integers.
local function cdiv(a, b)
  return idiv(a + b - 1, b)
end

local function int(x)
  return string.format('%d', x)
end

-- What an admitting check writes, applied only once every enforcing limit admits. Each
-- algorithm returns its decision followed by (op, key, a, b, ttl):
--   COUNTER: a counter now at `a`: SET key cost PX ttl when a == 0, else INCRBY key cost
--   VALUE:   SET key a PX ttl
--   LOG:     sorted-set member "<now>:<b>" at score now, replacing member `a` unless false
local COUNTER, VALUE, LOG = 1, 2, 3

local function apply(op, key, a, b, ttl, now, cost)
  if op == COUNTER then
    if a == 0 then
      redis.call('SET', key, cost, 'PX', int(ttl + SLACK))
    else
      redis.call('INCRBY', key, cost)
    end
  elseif op == VALUE then
    redis.call('SET', key, a, 'PX', int(ttl + SLACK))
  else
    if a then redis.call('ZREM', key, a) end
    redis.call('ZADD', key, int(now), int(now) .. ':' .. int(b))
    redis.call('PEXPIRE', key, int(ttl + SLACK))
  end
end
