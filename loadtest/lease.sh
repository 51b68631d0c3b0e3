#!/usr/bin/env bash
# Store calls, Redis CPU and gateway CPU per request with the over-limit cache and quota
# leasing (issue 16), rows side by side in interleaved rounds (medians). One redis-server and
# wrk and the NGINX upstream on core 1; each row's gateway (1 thread) on core 0.
#   hot-*      one API key at full speed under a limit it never reaches (1e9 a minute)
#   abusive-*  one API key far over its limit (10 an hour): every request but 10 is a 429
#   spread-*   10,000 API keys in turn, none reaching the limit
# For each row: req/s, gateway user+system µs per request (/proc/PID/task/*/stat), EVALSHA
# calls per request (INFO commandstats) and Redis CPU µs per request (INFO cpu), all deltas
# over the same wrk run.
#   base-ROW   with -B: row ROW on another build (an older tree); which rows: -R "ROW ...",
#              by default hot-redis abusive-cache spread-redis (Redis store, no leasing)
#   -o "ROW ..." runs only those rows (and their base rows)
# Usage: loadtest/lease.sh [-s SECONDS] [-c CONNECTIONS] [-r ROUNDS] [-b BINARY] [-B BASE_BINARY]
#                          [-R "ROW ..."] [-o "ROW ..."]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=8 conns=50 rounds=3 bin=target/release/tollgate base= only=
base_rows="hot-redis abusive-cache spread-redis"
while getopts s:c:r:b:B:R:o: o; do
  case $o in
    s) secs=$OPTARG ;; c) conns=$OPTARG ;; r) rounds=$OPTARG ;; b) bin=$OPTARG ;; B) base=$OPTARG ;;
    R) base_rows=$OPTARG ;; o) only=$OPTARG ;; *) exit 2 ;;
  esac
done
source loadtest/bench_lib.sh
need nginx nginx; need wrk wrk; need taskset util-linux; need python3 python3
need redis-server redis-server; need redis-cli redis-tools
[ -x "$bin" ] || { echo "no $bin: cargo build --release --bin tollgate" >&2; exit 1; }
start_bench
rport=$(free_port)
taskset -c 1 redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >/dev/null & pids+=($!)
rcli() { redis-cli -p "$rport" "$@"; }
for _ in $(seq 50); do [ "$(rcli PING 2>/dev/null)" = PONG ] && break; sleep 0.1; done

redis="store: { backend: redis, url: \"redis://127.0.0.1:$rport/0\", timeout: 1s }"
nocache="store: { backend: redis, url: \"redis://127.0.0.1:$rport/0\", timeout: 1s, over_limit_cache: { max_entries: 0 } }"
never="limit: 1000000000, window: 1m"
lease="limit: 1000000000, window: 1m, lease: { max: 50 }"
over="limit: 10, window: 1h"
declare -A rows=(
  [hot-memory]="store: { backend: memory }|$never|one"
  [hot-redis]="$redis|$never|one"
  [hot-lease]="$redis|$lease|one"
  [abusive-nocache]="$nocache|$over|abuser"
  [abusive-cache]="$redis|$over|abuser"
  [spread-redis]="$redis|$never|spread"
  [spread-lease]="$redis|$lease|spread"
)
order=(hot-memory hot-redis hot-lease abusive-nocache abusive-cache spread-redis spread-lease)
declare -A binary
for label in "${order[@]}"; do binary[$label]=$bin; done
if [ -n "$base" ]; then
  # The base build runs the same rows as this one, labelled base-ROW, just before them.
  with_base=()
  for label in "${order[@]}"; do
    if [[ " $base_rows " == *" $label "* ]]; then
      rows[base-$label]=${rows[$label]}; binary[base-$label]=$base; with_base+=("base-$label")
    fi
    with_base+=("$label")
  done
  order=("${with_base[@]}")
fi
if [ -n "$only" ]; then
  kept=()
  for label in "${order[@]}"; do
    [[ " $only " == *" ${label#base-} "* ]] && kept+=("$label")
  done
  order=("${kept[@]}")
fi
cat > "$dir/spread.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", { ["x-api-key"] = "spread-" .. (n % 10000) })
end
LUA
declare -A ports gpids keyarg
for label in "${order[@]}"; do
  IFS='|' read -r store limit load <<<"${rows[$label]}"
  port=$(free_port)
  sed "s/__UPSTREAM__/127.0.0.1:$up/; s|__STORE__|$store|; s|__LIMIT__|$limit|" loadtest/configs/lease.yaml > "$dir/$label.yaml"
  taskset -c 0 "${binary[$label]}" -c "$dir/$label.yaml" --listen "127.0.0.1:$port" \
    --admin-listen "127.0.0.1:$(free_port)" 2>"$dir/$label.log" & pids+=($!)
  ports[$label]=$port; gpids[$label]=$!
  case $load in
    one) echo "wrk.headers[\"x-api-key\"] = \"hot-$label\"" > "$dir/$label.lua" ;;
    abuser) echo "wrk.headers[\"x-api-key\"] = \"abuser-$label\"" > "$dir/$label.lua" ;;
    spread) cp "$dir/spread.lua" "$dir/$label.lua" ;;
  esac
  keyarg[$label]="-s $dir/$label.lua"
done
sleep 2

calls() { rcli INFO commandstats | awk -F'[=,:]' '/^cmdstat_evalsha:/ {print $3}' | grep . || echo 0; }
rcpu() { rcli INFO cpu | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
measure_row() { # label -> "rps user_us sys_us calls_per_req redis_us_per_req"
  local label=$1 port=${ports[$1]} before after c0 c1 r0 r1 out reqs
  # shellcheck disable=SC2086
  taskset -c 1 wrk -t1 -c "$conns" -d 2s ${keyarg[$label]} "http://127.0.0.1:$port/" >/dev/null
  before=$(ticks "${gpids[$label]}"); c0=$(calls); r0=$(rcpu)
  # shellcheck disable=SC2086
  out=$(taskset -c 1 wrk -t1 -c "$conns" -d "${secs}s" ${keyarg[$label]} "http://127.0.0.1:$port/")
  after=$(ticks "${gpids[$label]}"); c1=$(calls); r1=$(rcpu)
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  python3 - "$before" "$after" "$reqs" "$secs" "$hz" "$c0" "$c1" "$r0" "$r1" <<'PY'
import sys
b, a = sys.argv[1].split(), sys.argv[2].split()
reqs, secs, hz = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
us = 1e6 / hz
calls = int(sys.argv[7]) - int(sys.argv[6])
rcpu = (float(sys.argv[9]) - float(sys.argv[8])) * 1e6
print(f"{reqs / secs:.0f} {(int(a[0]) - int(b[0])) * us / reqs:.2f} {(int(a[1]) - int(b[1])) * us / reqs:.2f} {calls / reqs:.4f} {rcpu / reqs:.3f}")
PY
}
interleave "$rounds" "$dir/results" measure_row "${order[@]}"

python3 - "$dir/results" "${order[@]}" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    label, *v = line.split()
    rows.setdefault(label, []).append([float(x) for x in v])
print("| row | req/s | gateway µs/req (user+sys) | EVALSHA per request | Redis CPU µs/req |")
print("|---|---|---|---|---|")
for label in sys.argv[2:]:
    r = rows[label]
    med = lambda f: statistics.median(f(x) for x in r)
    print(f"| {label} | {med(lambda x: x[0]):,.0f} | {med(lambda x: x[1] + x[2]):.1f} | {med(lambda x: x[3]):.4f} | {med(lambda x: x[4]):.2f} |")
PY
echo "(wrk -t1 -c$conns -d${secs}s, $rounds interleaved rounds, medians; gateways on core 0; wrk, NGINX and redis-server on core 1)"
