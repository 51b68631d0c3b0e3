#!/usr/bin/env bash
# What Lua costs inside Redis, and the sliding_window script against an earlier version of the
# Redis scripts (default 8e6ace5: one script with all five algorithms, the sliding window in
# two string keys). Starts its own redis-server (core 0), stops it at the end.
#   Part 1, in-script costs: one EVAL runs a body 2,000 times; ns per iteration, best of 6.
#           Whole scripts are run the same way (on one key, so every call but the first is
#           the steady-state write).
#   Part 2, per call: usec_per_call of redis-benchmark (-c 50 -P 16, 10,000 random keys) for
#           INCR+EXPIRE, TIME+INCRBY, the sliding_window script before and now; 7 interleaved
#           rounds, medians.
# Usage: loadtest/lua_costs.sh [before-rev] [requests-for-redis-benchmark]
#   BEFORE_FILES: the lua/ files (without .lua) the "before" script is made of, in order;
#   default the 8e6ace5 layout, all five algorithms. For a revision whose scripts carry one
#   algorithm each: BEFORE_FILES="prelude sliding_window check".
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:-8e6ace5}
n=${2:-300000}
source loadtest/redis_lib.sh

old=$(for f in ${BEFORE_FILES:-prelude sliding_window fixed_window sliding_log token_bucket gcra check}; do
  git show "$before:lua/$f.lua"; done)
new=$(cat lua/prelude.lua lua/sliding_window.lua lua/check.lua)
# The check scripts' arguments: now (Redis clock), algorithm 1, limit, window, burst, cost, shadow.
check_args=("" 1 1000000 60000 1000000 1 0)

# loop NAME BODY: ns per run of BODY, run 2,000 times inside one EVAL.
loop() {
  local sha best=999999 ns
  sha=$(cli SCRIPT LOAD "local function body()
$2
end
for i = 1, 2000 do body() end
return 1")
  for _ in 1 2 3 4 5 6; do
    cli FLUSHALL >/dev/null; cli CONFIG RESETSTAT >/dev/null
    for _ in 1 2 3 4 5; do cli EVALSHA "$sha" 1 "{bench:loop}" "${check_args[@]}" >/dev/null; done
    ns=$(cli INFO commandstats | grep -E '^cmdstat_evalsha:' \
         | sed -E 's/.*usec_per_call=([0-9.]+).*/\1/' | awk '{printf "%.0f", $1 * 1000 / 2000}')
    [ "$ns" -lt "$best" ] && best=$ns
  done
  printf '%-40s %8s ns\n' "$1" "$best"
}

echo "== in-script costs (ns per iteration, best of 6)"
loop "(empty body)" "local x = 1"
loop "redis.call('TIME')" "redis.call('TIME')"
loop "redis.call('INCRBY', key, 1)" "redis.call('INCRBY', KEYS[1], 1)"
loop "redis.call('PING')" "redis.call('PING')"
loop "redis.call('DBSIZE')" "redis.call('DBSIZE')"
loop "tonumber(ARGV[4])" "local x = tonumber(ARGV[4])"
loop "ARGV[4] + 0" "local x = ARGV[4] + 0"
loop "five closures and a table" "local function a(x) return x end
local function b(x) return x end
local function c(x) return x end
local function d(x) return x end
local T = {}
T['1'] = function(x) return x end"
loop "sliding_window script, before ($before)" "$old"
loop "sliding_window script, now" "$new"

echo "== per call: usec_per_call, median of 7 interleaved rounds"
declare -A usecs
names=(incr+expire time+incrby before now)
for _ in 1 2 3 4 5 6 7; do
  bench "local v = redis.call('INCR', KEYS[1])
if v == 1 then redis.call('EXPIRE', KEYS[1], 60) end
return v" "{bench:incr:__rand_int__}"
  usecs[incr+expire]+="$usec "
  bench "local t = redis.call('TIME')
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
if v == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], 60000) end
return { v, t[1] }" "{bench:time:__rand_int__}" 1
  usecs[time+incrby]+="$usec "
  bench "$old" "{bench:old:__rand_int__}" "${check_args[@]}"
  usecs[before]+="$usec "
  bench "$new" "{bench:new:__rand_int__}:sw" "${check_args[@]}"
  usecs[now]+="$usec "
done
for name in "${names[@]}"; do
  printf '%-40s %8s us   (rounds: %s)\n' "$name" "$(echo "${usecs[$name]}" | median)" "${usecs[$name]}"
done
