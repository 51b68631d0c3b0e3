#!/usr/bin/env bash
# Server cost of each algorithm's script, and how close one gateway process gets to the Redis
# ceiling. Starts its own redis-server on a free loopback port (pinned to core 0), stops it
# at the end. Prints, per algorithm:
#   usec_per_call  EVALSHA time inside Redis (INFO commandstats) under redis-benchmark
#   ÷incr          usec_per_call ÷ that of the INCR+EXPIRE reference script, same run
#   redis_ceiling  decisions/s of redis-benchmark EVALSHA, 50 clients, pipeline 16: what one
#                  Redis core can do with this script
#   gateway_store  decisions/s of one tollgate process (examples/store_throughput, 64 tasks on
#                  one multiplexed connection, core 1)
#   ratio          gateway_store / redis_ceiling, measured in the same run
# and then the concurrency limits' take and release scripts (no gateway figure).
# Every script is measured in three interleaved rounds and the medians are printed, with
# three reference scripts (these machines drift 20-40% between runs, so compare rows of one
# run only):
#   empty          `return 1`: what any EVALSHA costs
#   incr+expire    INCR, and EXPIRE when the key is new: the issue's 2.4 µs anchor
#   time+incrby    TIME, INCRBY, and PEXPIRE when the key is new: the least any script that
#                  reads Redis's clock and writes a counter can cost
# Usage: loadtest/redis_scripts.sh [seconds-per-run] [requests-for-redis-benchmark]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
n=${2:-300000}
source loadtest/redis_lib.sh

cargo build --release --quiet --example store_throughput

algorithms=(sliding_window fixed_window sliding_log token_bucket gcra)
declare -A script key args usecs rbs
script[empty]='return 1'
key[empty]='{bench:empty:__rand_int__}'
script[incr+expire]="local v = redis.call('INCR', KEYS[1])
if v == 1 then redis.call('EXPIRE', KEYS[1], 60) end
return v"
key[incr+expire]='{bench:incr:__rand_int__}'
script[time+incrby]="local t = redis.call('TIME')
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
if v == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], 60000) end
return { v, t[1] }"
key[time+incrby]='{bench:time:__rand_int__}'
args[time+incrby]=1
code=0
for alg in "${algorithms[@]}"; do
  code=$((code + 1))
  # The script the gateway runs for a request whose limits all use this algorithm (see
  # SCRIPTS in src/store/redis.rs). One limit of 1,000,000 per minute on 10,000 random keys:
  # nearly every call admits and writes.
  script[$alg]=$(cat lua/prelude.lua "lua/$alg.lua" lua/check.lua)
  key[$alg]="{bench:$alg:__rand_int__}"
  args[$alg]="'' $code 1000000 60000 1000000 1 0"
done
# Concurrency limits' scripts: take a slot of a limit of 1,000,000 (timeout 60 s) for a random
# request id; give back a request id's slot, on an empty store (ZREM finds nothing: the
# release's floor).
script[concurrency_take]=$(cat lua/concurrency_take.lua)
key[concurrency_take]='{bench:conc:__rand_int__}:inflight'
args[concurrency_take]="req-__rand_int__ 1000000 60000 0"
script[concurrency_release]=$(cat lua/concurrency_release.lua)
key[concurrency_release]='{bench:conc:__rand_int__}:inflight'
args[concurrency_release]="req-__rand_int__"
names=(empty incr+expire time+incrby "${algorithms[@]}" concurrency_take concurrency_release)
# Three rounds, every script once per round, so drift hits all rows alike; medians reported.
for round in 1 2 3; do
  for name in "${names[@]}"; do
    eval "extra=(${args[$name]:-})"
    bench "${script[$name]}" "${key[$name]}" "${extra[@]}"
    usecs[$name]+="$usec "; rbs[$name]+="$rb "
  done
done

printf '%-15s %14s %6s %14s %14s %7s\n' script usec_per_call ÷incr redis_ceiling gateway_store ratio
incr=$(echo "${usecs[incr+expire]}" | median)
for name in "${names[@]}"; do
  u=$(echo "${usecs[$name]}" | median); r=$(echo "${rbs[$name]}" | median)
  per=$(python3 -c "print(f'{$u/$incr:.2f}')")
  if [[ " ${algorithms[*]} " == *" $name "* ]]; then
    gw=$(taskset -c 1 target/release/examples/store_throughput "redis://127.0.0.1:$port" "$name" "$secs" 64 | sed -E 's/.*decisions_per_s=([0-9]+).*/\1/')
    printf '%-15s %14s %6s %14.0f %14s %7.2f\n' "$name" "$u" "$per" "$r" "$gw" "$(python3 -c "print($gw/$r)")"
  else
    printf '%-15s %14s %6s %14.0f\n' "$name" "$u" "$per" "$r"
  fi
done
