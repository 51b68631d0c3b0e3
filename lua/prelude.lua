-- tollgate: shared helpers. The scripts in this directory are concatenated, in the order
-- prelude, algorithms, check, into the scripts the gateway runs with EVALSHA: one per
-- algorithm (prelude, that algorithm, check) for requests whose limits all use it, and one
-- with all five for requests that mix them. Each algorithm file adds one entry to ALG, keyed
-- by the algorithm's code as the string the caller sends, so dispatch converts nothing.
-- Every number stays below 2^53 (validation bounds limit x window), so Lua's doubles are
-- exact. Lua prints numbers with %.14g: exact for integers below 1e14, which holds for
-- timestamps in ms and window numbers; other integers are written back with %d (int).
-- Number <-> string conversions are a large part of a script's cost, so the hot paths avoid
-- them where they can.
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
-- algorithm returns its decision followed by (op, key, a, b, ttl). `cost` is the caller's
-- string, passed through unconverted.
--   WINDOW:  hash field `a` (a window's count, "c0" or "c1") grows by cost; when `b` is a
--            window number the window is new: its number field ("n0" or "n1") is set to `b`,
--            the count to cost, and the key's expiry to ttl
--   COUNTER: a counter now at `a`: SET key cost PX ttl when a == 0, else INCRBY key cost
--   VALUE:   SET key a PX ttl
--   LOG:     sorted-set member "<now>:<b>" at score now, replacing member `a` unless false
local WINDOW, COUNTER, VALUE, LOG = 0, 1, 2, 3

local function apply(op, key, a, b, ttl, now, cost)
  if op == WINDOW then
    if b then
      redis.call('HSET', key, a == 'c0' and 'n0' or 'n1', b, a, cost)
      redis.call('PEXPIRE', key, int(ttl + SLACK))
    else
      redis.call('HINCRBY', key, a, cost)
    end
  elseif op == COUNTER then
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
