#!/usr/bin/env bash
# CPU time per proxied request of tollgate gateways side by side: user + system time of every
# thread of the gateway process (/proc/PID/task/*/stat, the fields after the closing
# parenthesis, since thread names contain spaces) divided by the requests wrk completed in the
# same interval. Rows run in interleaved A-B-…-B-A rounds; each figure is the median of the
# rounds. The gateways are pinned to core 0 and wrk and the upstream (NGINX `return 200`) to
# core 1, unless PROXY_CPUS and LOAD_CPUS say otherwise (see bench_lib.sh). Every process is
# started here on free loopback ports and stopped at the end.
#
# Usage: loadtest/cpu.sh [-s SECONDS] [-c CONNECTIONS] [-r ROUNDS] LABEL=BINARY=CONFIG[=FLAGS] ...
#   FLAGS, when given, are passed to the binary before its config (split on spaces), e.g.
#   bare0=target/release/examples/bare_pingora=loadtest/configs/no-limits.yaml=--no-peer-timeouts
#   CONFIG is a gateway.yaml in which __UPSTREAM__ stands for the upstream's host:port,
#   __TMP__ for a temporary directory removed at the end (for access logs), and __REDIS__ for
#   a redis-server started here (with wrk) when a config names it. The access log is on by
#   default (to stdout, kept in a file here): comparison rows use the `-nolog` configs.
# Example (this tree against an older build):
#   loadtest/cpu.sh before=/tmp/old/tollgate=loadtest/configs/one-limit-nolog.yaml \
#                   after=target/release/tollgate=loadtest/configs/one-limit-nolog.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
secs=10 conns=50 rounds=3
while getopts s:c:r: o; do
  case $o in s) secs=$OPTARG ;; c) conns=$OPTARG ;; r) rounds=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,19p' "$0" >&2; exit 2; }
source loadtest/bench_lib.sh
need nginx nginx; need wrk wrk; need taskset util-linux; need python3 python3
start_bench
redis_if_named "$@"

labels=()
declare -A ports gpids
for row in "$@"; do
  IFS== read -r label bin cfg flags <<<"$row"
  start_gateway "$label" "$bin" "$cfg" "${flags:-}"
  labels+=("$label"); ports[$label]=$port; gpids[$label]=$!
done
sleep 2

measure_row() { # label -> "rps user_us sys_us"
  measure "${gpids[$1]}" "${ports[$1]}" "$secs" "$conns" | awk '{print $1, $4, $5}'
}
interleave "$rounds" "$dir/results" measure_row "${labels[@]}"

python3 - "$dir/results" "${labels[@]}" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    label, rps, user, sys_ = line.split()
    rows.setdefault(label, []).append((float(rps), float(user), float(sys_)))
labels = sys.argv[2:]
base = None
print(f"| row | req/s | user µs/req | sys µs/req | total µs/req | ÷ {labels[0]} |")
print("|---|---|---|---|---|---|")
for label in labels:
    rps = statistics.median(r[0] for r in rows[label])
    user = statistics.median(r[1] for r in rows[label])
    sys_ = statistics.median(r[2] for r in rows[label])
    total = statistics.median(r[1] + r[2] for r in rows[label])
    base = base or total
    print(f"| {label} | {rps:,.0f} | {user:.1f} | {sys_:.1f} | {total:.1f} | {total / base:.2f} |")
PY
echo "(wrk -t1 -c$conns -d${secs}s, $rounds interleaved rounds, medians; gateways on CPUs $PROXY_CPUS, wrk and the NGINX upstream on CPUs $LOAD_CPUS)"
