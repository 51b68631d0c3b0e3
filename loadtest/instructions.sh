#!/usr/bin/env bash
# Instructions per proxied request of tollgate gateways, counted by valgrind's callgrind: the
# repeatable companion of cpu.sh on machines where CPU time drifts 20-40% from minute to
# minute. Each row runs its gateway under callgrind (all threads), warms it up with 200
# requests, zeroes the counters, sends N requests one after the other on one keep-alive
# connection, and dumps the counters: instructions of the whole process divided by N. The
# upstream is NGINX `return 200`. Every process is started here on free loopback ports and
# stopped at the end.
#
# Usage: loadtest/instructions.sh [-n REQUESTS] LABEL=BINARY=CONFIG[=FLAGS] ...
#   FLAGS as for cpu.sh (passed to the binary before its config).
#   CONFIG as for cpu.sh (__UPSTREAM__ and __TMP__ are substituted; __REDIS__ too, for which
#   a redis-server is started on core 1 when a config names it). With KEEP=DIR the callgrind
#   files are kept there as LABEL.cg.*, for callgrind_annotate. CALLGRIND_OPTS adds options to
#   callgrind's (e.g. "--cache-sim=yes --branch-sim=yes" for simulated cache and branch misses).
#   With ATOMICS=1 a column counts the atomic read-modify-writes per request (instructions with
#   a `lock` prefix, `xchg` with memory, `mfence`: loadtest/atomics.py), which cost tens of
#   cycles each here where callgrind counts one instruction; ATOMICS_TOP=N lists each row's N
#   functions with the most on standard error.
set -euo pipefail
cd "$(dirname "$0")/.."
n=3000
while getopts n: o; do
  case $o in n) n=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
source loadtest/bench_lib.sh
need nginx nginx; need valgrind valgrind; need callgrind_control valgrind
need python3 python3; need taskset util-linux; need curl curl
start_bench
redis_if_named "$@"

# Send $2 GETs to port $1 on one keep-alive connection, one after the other.
send() {
  taskset -c 1 python3 - "$1" "$2" <<'PY'
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
for _ in range(int(sys.argv[2])):
    c.request("GET", "/x")
    r = c.getresponse(); r.read()
    if r.status != 200: sys.exit(f"status {r.status}")
PY
}

atomics=${ATOMICS:-}
[ -n "$atomics" ] && CALLGRIND_OPTS="${CALLGRIND_OPTS:-} --dump-instr=yes"
if [ -n "$atomics" ]; then
  echo "| row | instructions per request | ÷ ${1%%=*} | atomic read-modify-writes per request |"
  echo "|---|---|---|---|"
else
  echo "| row | instructions per request | ÷ ${1%%=*} |"
  echo "|---|---|---|"
fi
base=""
for row in "$@"; do
  IFS== read -r label bin cfg flags <<<"$row"
  port=$(free_port) admin=$(free_port)
  gateway_config "$cfg" "$dir/$label.yaml"
  taskset -c 0 valgrind --tool=callgrind ${CALLGRIND_OPTS:-} --callgrind-out-file="$dir/$label.cg" \
    "$bin" ${flags:-} -c "$dir/$label.yaml" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
    >"$dir/$label.out" 2>"$dir/$label.log" & pid=$!
  pids+=($pid)
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$admin/healthz" >/dev/null && break; sleep 0.5; done
  send "$port" 200
  callgrind_control -z "$pid" >/dev/null 2>&1
  send "$port" "$n"
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  total=$(grep -h '^totals:' "$dir/$label.cg".* | tail -1 | awk '{print $2}')
  [ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp "$dir/$label.cg".* "$KEEP/"
  per=$((total / n))
  base=${base:-$per}
  row=$(python3 -c "print(f'| $label | {$per:,} | {$per / $base:.3f} |')")
  if [ -n "$atomics" ]; then
    row="$row $(python3 loadtest/atomics.py "$(ls "$dir/$label.cg".* | tail -1)" "$n" "${ATOMICS_TOP:-0}") |"
  fi
  echo "$row"
done
echo "(callgrind, all threads; $n requests on one keep-alive connection after 200 to warm up; NGINX upstream)"
