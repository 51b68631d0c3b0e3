#!/usr/bin/env bash
# Where each proxy's CPU time per request goes, by phase, in real cycles with call stacks:
# `perf record -e cycles --call-graph dwarf` (DWARF unwinding, so the release build's line
# tables suffice; no frame pointers needed) on the proxy under `wrk -t1 -c50`, then
# loadtest/profile.py sorts every sample's cycles into the phase of the innermost Pingora or
# tollgate function on its stack (request head, upstream connection, upstream request and
# response, downstream response, pool return, the request's own future, tollgate's filters,
# the runtime), user and kernel apart. Kernel cycles include the loopback delivery of the
# proxy's own writes to its peers (softirq receive on the sender's CPU), shown apart.
#
# Each row is measured twice: first without perf (CPU µs per request from /proc, as cpu.sh), then
# under perf for the shares; a phase's µs is its share of the first figure. Layout as cpu.sh:
# the proxy on PROXY_CPUS (default 0), wrk and the upstream (NGINX `return 200`) on LOAD_CPUS.
# Every process is started here on free loopback ports and stopped at the end.
#
# With -c ROUNDS it profiles nothing and counts instead: `perf stat` cycles and instructions per
# request, user and kernel apart, of every row in interleaved A-B-...-B-A rounds (medians). A
# cycle count is the work the proxy's threads did, however long the machine kept them waiting;
# CPU time from /proc also moves with what else the host runs.
#
# With -t ROUNDS it counts `perf stat -e task-clock` (a software event: it works where the
# machine has no hardware counters) per request instead, in the same interleaved rounds, and
# prints each row's median and the median of its per-round ratios to the first row. A row's
# measurement and the first row's in the same round are at most a few tens of seconds apart,
# so most of the machine's drift from minute to minute (up to a fifth on these machines)
# cancels in the ratio; put the row to compare with first, and few rows.
#
# Usage: loadtest/profile.sh [-s SECONDS] [-d N] [-c ROUNDS | -t ROUNDS] ROW...
#   ROW: nginx (NGINX + limit_req, as in proxy.sh; one worker), or LABEL=BINARY=CONFIG[=FLAGS]
#   as for cpu.sh, e.g. bare=target/release/examples/bare_pingora=loadtest/configs/no-limits-nolog.yaml
#   -d N lists the N leaf functions with the most cycles under each phase's table.
#   With KEEP=DIR each row's perf data is kept as DIR/LABEL.perf.data (for `perf report -i`), and
#   its request count as DIR/LABEL.requests.
# Needs perf (Debian's linux-perf) with access to hardware cycles: `perf stat -e cycles true`
# (for -t, perf alone). Without them, PERF_EVENT=cpu-clock samples perf's software clock instead:
# the tables' "cycles" are then nanoseconds, and the shares the same.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=5 detail=0 count_rounds=0 clock_rounds=0
while getopts s:d:c:t: o; do
  case $o in
    s) secs=$OPTARG ;; d) detail=$OPTARG ;; c) count_rounds=$OPTARG ;; t) clock_rounds=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,36p' "$0" >&2; exit 2; }
source loadtest/bench_lib.sh
need nginx nginx; need wrk wrk; need perf linux-perf; need taskset util-linux; need python3 python3
[ "$clock_rounds" -gt 0 ] || [ -n "${PERF_EVENT:-}" ] || perf stat -e cycles true >/dev/null 2>&1 || {
  echo "perf cannot count cycles on this machine (perf stat -e cycles true failed)" >&2
  exit 1
}
start_bench
start_rows "$@"
sleep 2
# NGINX's workers are its master's children, there by now.
for label in "${labels[@]}"; do procs[$label]=$(tree "${procs[$label]}"); done

if [ "$clock_rounds" -gt 0 ]; then
  clock_row() { # label -> task-clock µs per request
    local port=${ports[$1]} out reqs
    taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d2s "http://127.0.0.1:$port/" >/dev/null
    perf stat -x, -e task-clock -p "$(echo ${procs[$1]} | tr ' ' ,)" -o "$dir/$1.stat" -- sleep "$secs" & rec=$!
    out=$(taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d"${secs}s" "http://127.0.0.1:$port/")
    wait "$rec"
    reqs=$(echo "$out" | awk '/requests in/ {print $1}')
    awk -F, -v n="$reqs" -v row="$1" '$3 == "task-clock" {ms = $1}
      END {
        if (ms == "") { print "row " row ": perf counted no task-clock" > "/dev/stderr"; exit 1 }
        printf "%.3f\n", ms * 1000 / n
      }' "$dir/$1.stat"
  }
  interleave "$clock_rounds" "$dir/clock" clock_row "${labels[@]}"
  python3 - "$dir/clock" "${labels[@]}" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    label, v = line.split()
    rows.setdefault(label, []).append(float(v))
labels = sys.argv[2:]
first = rows[labels[0]]
print(f"| row | task-clock µs/req (median) | ÷ {labels[0]}, median of rounds | ÷ {labels[0]}, rounds |")
print("|---|---|---|---|")
for l in labels:
    ratios = [a / b for a, b in zip(rows[l], first)]
    spread = ", ".join(f"{r:.3f}" for r in ratios)
    print(f"| {l} | {statistics.median(rows[l]):.2f} | {statistics.median(ratios):.3f} | {spread} |")
PY
  echo "(perf stat -e task-clock for ${secs}s under wrk -t1 -c50, $clock_rounds interleaved rounds; proxies on CPUs $PROXY_CPUS; wrk and the upstream on CPUs $LOAD_CPUS)"
  exit 0
fi

if [ "$count_rounds" -gt 0 ]; then
  count_row() { # label -> "cycles:u cycles:k instructions:u instructions:k" per request
    local port=${ports[$1]} out reqs
    taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d2s "http://127.0.0.1:$port/" >/dev/null
    perf stat -x, -e cycles:u,cycles:k,instructions:u,instructions:k -p "$(echo ${procs[$1]} | tr ' ' ,)" \
      -o "$dir/$1.stat" -- sleep "$secs" & rec=$!
    out=$(taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d"${secs}s" "http://127.0.0.1:$port/")
    wait "$rec"
    reqs=$(echo "$out" | awk '/requests in/ {print $1}')
    # All four counters, in the order asked, or the row fails (a "<not counted>" would shift them).
    awk -F, -v n="$reqs" -v row="$1" '$1 ~ /^[0-9]+$/ {v[++k] = $1 / n}
      END {
        if (k != 4) { print "row " row ": perf counted " k " of 4 events" > "/dev/stderr"; exit 1 }
        printf "%.0f %.0f %.0f %.0f\n", v[1], v[2], v[3], v[4]
      }' "$dir/$1.stat"
  }
  interleave "$count_rounds" "$dir/counts" count_row "${labels[@]}"
  python3 - "$dir/counts" "${labels[@]}" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    label, *v = line.split()
    rows.setdefault(label, []).append([float(x) for x in v])
labels = sys.argv[2:]
med = {l: [statistics.median(r[i] for r in rows[l]) for i in range(4)] + [statistics.median(r[0] + r[1] for r in rows[l])] for l in labels}
print(f"| row | user cycles/req | kernel cycles/req | total cycles/req | ÷ {labels[0]} | user instructions/req | kernel instructions/req |")
print("|---|---|---|---|---|---|---|")
for l in labels:
    m = med[l]
    print(f"| {l} | {m[0]:,.0f} | {m[1]:,.0f} | {m[4]:,.0f} | {m[4] / med[labels[0]][4]:.2f} | {m[2]:,.0f} | {m[3]:,.0f} |")
PY
  echo "(perf stat for ${secs}s under wrk -t1 -c50, $count_rounds interleaved rounds, medians; proxies on CPUs $PROXY_CPUS; wrk and the upstream on CPUs $LOAD_CPUS)"
  exit 0
fi

for label in "${labels[@]}"; do
  port=${ports[$label]}
  # shellcheck disable=SC2086
  read -r _ _ _ user_us sys_us _ <<<"$(measure "${procs[$label]}" "$port" "$secs" 50)"
  cpu_us=$(python3 -c "print($user_us + $sys_us)")
  perf record -q -e "${PERF_EVENT:-cycles}" --call-graph dwarf,16384 -F 2000 -p "$(echo ${procs[$label]} | tr ' ' ,)" \
    -o "$dir/$label.data" -- sleep "$secs" 2>"$dir/$label.perf.log" & rec=$!
  out=$(taskset -c "$LOAD_CPUS" wrk -t1 -c50 -d"${secs}s" "http://127.0.0.1:$port/")
  wait "$rec" || { cat "$dir/$label.perf.log" >&2; exit 1; }
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  perf script -i "$dir/$label.data" -F period,ip,sym 2>/dev/null |
    python3 loadtest/profile.py "$label" "$reqs" "$cpu_us" "$detail"
  echo
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP"
    mv "$dir/$label.data" "$KEEP/$label.perf.data"
    echo "$reqs" >"$KEEP/$label.requests"
  else
    rm -f "$dir/$label.data"
  fi
done
echo "(perf record -e cycles --call-graph dwarf -F 2000 for ${secs}s under wrk -t1 -c50; proxies on CPUs $PROXY_CPUS; wrk and the upstream on CPUs $LOAD_CPUS)"
