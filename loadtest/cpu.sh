#!/usr/bin/env bash
# CPU time per proxied request of tollgate gateways side by side: user + system time of every
# thread of the gateway process (/proc/PID/task/*/stat, the fields after the closing
# parenthesis, since thread names contain spaces) divided by the requests wrk completed in the
# same interval. Rows run in interleaved A-B-…-B-A rounds; each figure is the median of the
# rounds. The gateways are pinned to core 0; wrk and the upstream (NGINX `return 200`) to
# core 1. Every process is started here on free loopback ports and stopped at the end.
#
# Usage: loadtest/cpu.sh [-s SECONDS] [-c CONNECTIONS] [-r ROUNDS] LABEL=BINARY=CONFIG ...
#   CONFIG is a gateway.yaml in which __UPSTREAM__ stands for the upstream's host:port and
#   __TMP__ for a temporary directory removed at the end (for access logs).
# Example (this tree against an older build):
#   loadtest/cpu.sh before=/tmp/old/tollgate=loadtest/configs/one-limit.yaml \
#                   after=target/release/tollgate=loadtest/configs/one-limit.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
secs=10 conns=50 rounds=3
while getopts s:c:r: o; do
  case $o in s) secs=$OPTARG ;; c) conns=$OPTARG ;; r) rounds=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
for t in nginx wrk taskset python3; do
  command -v $t >/dev/null || { echo "needs $t: apt-get install -y nginx wrk util-linux python3" >&2; exit 1; }
done
. loadtest/upstream_lib.sh

labels=() ports=() gpids=()
for row in "$@"; do
  IFS== read -r label bin cfg <<<"$row"
  port=$(free_port)
  sed "s/__UPSTREAM__/127.0.0.1:$up/; s|__TMP__|$dir|" "$cfg" > "$dir/$label.yaml"
  taskset -c 0 "$bin" -c "$dir/$label.yaml" --listen "127.0.0.1:$port" \
    --admin-listen "127.0.0.1:$(free_port)" 2>"$dir/$label.log" & pids+=($!)
  labels+=("$label") ports+=("$port") gpids+=($!)
done
sleep 2

# CPU ticks (user, system) of every thread of a process.
ticks() { cat /proc/"$1"/task/*/stat 2>/dev/null | sed 's/.*) //' | awk '{u += $12; s += $13} END {print u, s}'; }
hz=$(getconf CLK_TCK)

measure() { # index -> "rps user_us sys_us"
  local i=$1 pid=${gpids[$1]} port=${ports[$1]} before after out reqs
  taskset -c 1 wrk -t1 -c "$conns" -d 2s "http://127.0.0.1:$port/" >/dev/null   # warm-up
  before=$(ticks "$pid")
  out=$(taskset -c 1 wrk -t1 -c "$conns" -d "${secs}s" --latency "http://127.0.0.1:$port/")
  after=$(ticks "$pid")
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  echo "$out" | grep -q 'Non-2xx' && { echo "row ${labels[$i]}: non-2xx answers:" >&2; echo "$out" >&2; exit 1; }
  python3 - "$before" "$after" "$reqs" "$secs" "$hz" <<'PY'
import sys
b, a, reqs, secs, hz = sys.argv[1].split(), sys.argv[2].split(), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
us = 1e6 / hz
print(f"{reqs / secs:.0f} {(int(a[0]) - int(b[0])) * us / reqs:.2f} {(int(a[1]) - int(b[1])) * us / reqs:.2f}")
PY
}

n=${#labels[@]}
for r in $(seq "$rounds"); do
  order=$(seq 0 $((n - 1)))
  [ $((r % 2)) -eq 0 ] && order=$(seq $((n - 1)) -1 0)   # A-B, then B-A
  for i in $order; do
    echo "${labels[$i]} $(measure "$i")" >> "$dir/results"
    echo "round $r: ${labels[$i]} done" >&2
  done
done

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
echo "(wrk -t1 -c$conns -d${secs}s, $rounds interleaved rounds, medians; gateways on core 0, wrk and the NGINX upstream on core 1)"
