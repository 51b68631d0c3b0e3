-- tollgate: give back one request's concurrency slots (its own EVALSHA, once per request).
-- KEYS: the sorted sets the request took a slot from. ARGV[1]: the request id.
-- Returns the number of slots freed: a slot that already expired is not freed twice, and an
-- emptied set is removed by Redis.
local freed = 0
for i = 1, #KEYS do
  freed = freed + redis.call('ZREM', KEYS[i], ARGV[1])
end
return { freed }
