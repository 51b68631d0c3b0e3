#!/usr/bin/env bash
# Two proxies' CPU time per request, measured at the same time: the sharpest comparison these
# shared machines allow. Both proxies run on PROXY_CPUS (default 0), each under its own
# `wrk -t1 -c50` on LOAD_CPUS (default 1, with the upstream, NGINX `return 200`, and Redis when
# a config names it). In every round both are loaded for the same SECONDS and
# `perf stat -e task-clock` counts each one's threads over that one window, so whatever the
# host does meanwhile (other guests, frequency, steal time) falls on both alike and cancels in
# the ratio. Rounds measured one row after the other (profile.sh -t, proxy.sh) see the machine
# drift between the rows by up to a fifth; here the ratio of one round to the next moves by
# about 1%, and the same binary against itself reads 1.00 within that.
#
# The layout differs from proxy.sh's: the two proxies share a core, each getting about half of
# it, so their absolute figures are not a lone proxy's (they batch more work per wakeup); the
# ratio is what this measures. Every process is started here on free loopback ports and
# stopped at the end.
#
# Usage: loadtest/paired.sh [-r ROUNDS] [-s SECONDS] ROW_A ROW_B
#   ROW: nginx (NGINX + limit_req as in proxy.sh, one worker), or LABEL=BINARY=CONFIG[=FLAGS]
#   as for cpu.sh, e.g. bare=target/release/examples/bare_pingora=loadtest/configs/no-limits-nolog.yaml
#   Defaults: 8 rounds of 5 seconds. Prints each round, then the medians and the median of the
#   rounds' ratios B ÷ A. A check of the method: the same row twice (under two labels).
# Needs perf (Debian's linux-perf); task-clock is a software event, so no hardware counters.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=8 secs=5
while getopts r:s: o; do
  case $o in r) rounds=$OPTARG ;; s) secs=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || { sed -n '2,22p' "$0" >&2; exit 2; }
source loadtest/bench_lib.sh
need nginx nginx; need wrk wrk; need perf linux-perf; need taskset util-linux; need python3 python3
start_bench
start_rows "$@"
[ "${labels[0]}" != "${labels[1]}" ] || { echo "the two rows need two labels" >&2; exit 2; }
sleep 2
for label in "${labels[@]}"; do procs[$label]=$(tree "${procs[$label]}"); done

# load SECS: both proxies under their own wrk for SECS seconds at once; with COUNT, perf stat
# counts each proxy's task-clock over the same window, into $dir/LABEL.stat and LABEL.reqs.
load() {
  local secs=$1 count=${2:-} waits=() label
  for label in "${labels[@]}"; do
    if [ -n "$count" ]; then
      perf stat -x, -e task-clock -p "$(echo ${procs[$label]} | tr ' ' ,)" -o "$dir/$label.stat" \
        -- sleep "$secs" & waits+=($!)
    fi
    (taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d"${secs}s" "http://127.0.0.1:${ports[$label]}/" |
      awk '/requests in/ {print $1} /Non-2xx/ {print "non-2xx" > "/dev/stderr"; exit 1}' \
        >"$dir/$label.reqs") & waits+=($!)
  done
  wait "${waits[@]}"
}

per_request() { # label -> task-clock µs per request of the last counted window
  awk -F, -v n="$(cat "$dir/$1.reqs")" -v row="$1" '$3 == "task-clock" {ms = $1}
    END {
      if (ms == "" || n == 0) { print "row " row ": no task-clock or no requests" > "/dev/stderr"; exit 1 }
      printf "%.3f\n", ms * 1000 / n
    }' "$dir/$1.stat"
}

A=${labels[0]} B=${labels[1]}
for r in $(seq "$rounds"); do
  load 1
  load "$secs" count
  echo "$r $(per_request "$A") $(cat "$dir/$A.reqs") $(per_request "$B") $(cat "$dir/$B.reqs")" >>"$dir/rounds"
  echo "round $r of $rounds" >&2
done
python3 - "$dir/rounds" "$A" "$B" "$secs" <<'PY'
import statistics, sys
path, a, b, secs = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
rows = [line.split() for line in open(path)]
print(f"| round | {a} µs/req | {a} req/s | {b} µs/req | {b} req/s | {b} ÷ {a} |")
print("|---|---|---|---|---|---|")
ratios = []
for r, ua, na, ub, nb in rows:
    ratio = float(ub) / float(ua)
    ratios.append(ratio)
    print(f"| {r} | {float(ua):.2f} | {int(na) / secs:,.0f} | {float(ub):.2f} | {int(nb) / secs:,.0f} | {ratio:.3f} |")
med = lambda i: statistics.median(float(row[i]) for row in rows)
print(f"| **median** | {med(1):.2f} | | {med(3):.2f} | | **{statistics.median(ratios):.3f}** (rounds {min(ratios):.3f}-{max(ratios):.3f}) |")
PY
echo "(both proxies on CPUs $PROXY_CPUS at once, each under wrk -t1 -c50 on CPUs $LOAD_CPUS; perf stat -e task-clock over the same ${secs}s window; $rounds rounds)"
