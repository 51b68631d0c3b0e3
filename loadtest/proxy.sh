#!/usr/bin/env bash
# Whole-system cost of a proxied request: tollgate against NGINX, HAProxy and a bare Pingora
# proxy built from this repo (the framework's floor), in the same run and the same layout:
# every proxy pinned to core 0; wrk, the upstream (NGINX `return 200`) and Redis on core 1.
# Each proxy runs THREADS workers (default 1). Every process is started here on free loopback
# ports and stopped at the end.
#
# Per proxy it reports req/s, p50/p99 latency and the CPU time per request: user and system
# time of every thread of the proxy's processes (/proc/PID/task/*/stat) divided by the
# requests served in the same interval. Rows run in interleaved rounds (A-B-...-B-A), and each
# figure is the median of ROUNDS rounds; a ratio (÷ nginx, ÷ no limits: the tollgate row without
# limits built the same way) is the median of the rounds' own ratios, which cancels most of the
# machine's drift from round to round. Then a fixed-rate run at half of the slowest row's
# peak reports p50/p99/p99.9 latency of each proxy at the same offered load (oha).
#
# Rows (ROWS to pick; all by default):
#   nginx       NGINX reverse proxy + limit_req with a zone that never denies, upstream keepalive
#   haproxy     HAProxy + a stick-table request-rate rule that never denies
#   bare        examples/bare_pingora: Pingora ProxyHttp, no filters, tollgate's upstream
#               peer options (the floor)
#   bare0       the same with Pingora's default peer options, no upstream timeouts (not in
#               the default rows; it measures what the timeouts cost)
#   nolimits    tollgate, one route, no limits
#   memory      tollgate, one per-IP sliding_window limit on the memory store (never denies)
#   redis       the same limit on the Redis store (Redis on core 1)
#   accesslog   tollgate, no limits, JSON access log to a file (when the build has one)
#   ROW-pgo     any of the four tollgate rows or bare/bare0, built by scripts/pgo.sh instead
#               (the production profile with profile-guided optimization; not in the default
#               rows: it adds two builds the first time)
# Access logs are off everywhere else (NGINX `access_log off`); tollgate's metrics are on.
#
# Usage: loadtest/proxy.sh [-s SECONDS] [-c CONNECTIONS] [-r ROUNDS] [-t THREADS]
#        ROWS="bare nolimits" loadtest/proxy.sh ...
#        PROXY_CPUS=0,1 LOAD_CPUS=0,1 loadtest/proxy.sh -t 2   # both cores shared (scaling)
#        PROFILE=release loadtest/proxy.sh   # the quick start's build instead of `production`
#        ROWS="nginx bare bare-pgo memory memory-pgo" loadtest/proxy.sh   # with and without PGO
#        PGO_BUILT=1 ROWS="nginx bare-pgo memory-pgo" loadtest/proxy.sh   # target/pgo as a
#          `scripts/pgo.sh --bare` of this tree left it, not built again
set -euo pipefail
cd "$(dirname "$0")/.."
secs=10 conns=50 rounds=3 threads=1
while getopts s:c:r:t: o; do
  case $o in s) secs=$OPTARG ;; c) conns=$OPTARG ;; r) rounds=$OPTARG ;; t) threads=$OPTARG ;; *) exit 2 ;; esac
done
rows=(${ROWS:-nginx haproxy bare nolimits memory redis accesslog})
source loadtest/bench_lib.sh
need nginx nginx; need wrk wrk; need haproxy haproxy; need redis-server redis-server
need taskset util-linux; need python3 python3
# The binaries are built with the profile that ships (Cargo.toml's `production`: fat LTO,
# one codegen unit), PROFILE=release for the quick start's build.
profile=${PROFILE:-production}
# Built only when a row runs it: NGINX, HAProxy and the -pgo rows need no production build.
for row in "${rows[@]}"; do
  case $row in nginx | haproxy | *-pgo) ;; *)
    cargo build --profile "$profile" --quiet --bin tollgate --example bare_pingora
    break ;;
  esac
done
if [[ " ${rows[*]} " == *-pgo\ * ]] && [ "${PGO_BUILT:-}" != 1 ]; then scripts/pgo.sh --bare; fi
start_bench
start_redis

gateway_yaml() { # limit-line extra
  printf 'server: { threads: %s }\nupstreams: { up: ["127.0.0.1:%s"] }\nroutes: [ { name: all, match: { path_prefix: / }, upstream: up } ]\n%s\n%s\n' \
    "$threads" "$up" "$1" "$2"
}
limit='limits: [ { name: per-ip, key: [client_ip], limit: 1000000000, window: 1m } ]'

declare -A port measured
start_row() { # row -> sets port[row], measured[row] (pids)
  local row=$1 kind=${1%-pgo} p bin=target/$profile/tollgate
  local bare_bin=target/$profile/examples/bare_pingora
  if [ "$kind" != "$row" ]; then bin=target/pgo/tollgate bare_bin=target/pgo/bare_pingora; fi
  p=$(free_port); port[$row]=$p
  case $kind in
    nginx)
      nginx_proxy "$p" "$threads"
      measured[$row]=$! ;;
    haproxy)
      cat > "$dir/haproxy.cfg" <<CONF
global
  nbthread $threads
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe
  bind 127.0.0.1:$p
  stick-table type ip size 100k expire 60s store http_req_rate(60s)
  http-request track-sc0 src
  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 1000000000 }
  default_backend be
backend be
  http-reuse always
  server up 127.0.0.1:$up
CONF
      taskset -c "$PROXY_CPUS" haproxy -f "$dir/haproxy.cfg" -db & pids+=($!)
      measured[$row]=$! ;;
    bare|bare0)
      local bare_flags=()
      [ "$kind" = bare0 ] && bare_flags=(--no-peer-timeouts)
      gateway_yaml "" "" > "$dir/$row.yaml"
      taskset -c "$PROXY_CPUS" "$bare_bin" "${bare_flags[@]}" -c "$dir/$row.yaml" --listen "127.0.0.1:$p" \
        --admin-listen "127.0.0.1:$(free_port)" 2>"$dir/$row.log" & pids+=($!)
      measured[$row]=$! ;;
    nolimits|memory|redis|accesslog)
      local extra="" redis_flag=()
      [ "$kind" = memory ] || [ "$kind" = redis ] && extra=$limit
      [ "$kind" = redis ] && redis_flag=(--redis-url "redis://127.0.0.1:$rp")
      [ "$kind" = accesslog ] && extra="access_log: { enabled: true, format: json, path: $dir/$row.log.json }"
      [ "$kind" != accesslog ] && extra="$extra
access_log: { enabled: false }"
      gateway_yaml "" "$extra" > "$dir/$row.yaml"
      if ! "$bin" check "$dir/$row.yaml" >/dev/null; then
        echo "row $row: this build does not take its config, skipped: $("$bin" check "$dir/$row.yaml" | head -1)" >&2
        gateway_yaml "" "${extra%%access_log*}" > "$dir/$row.yaml"
        [ "$kind" = accesslog ] && { unset 'port[$row]'; return; }
      fi
      taskset -c "$PROXY_CPUS" "$bin" -c "$dir/$row.yaml" --listen "127.0.0.1:$p" --admin-listen "127.0.0.1:$(free_port)" \
        "${redis_flag[@]}" 2>"$dir/$row.log" & pids+=($!)
      measured[$row]=$! ;;
    *) echo "unknown row $row" >&2; exit 2 ;;
  esac
}
for row in "${rows[@]}"; do start_row "$row"; done
sleep 2
active=()
for row in "${rows[@]}"; do [ -n "${port[$row]:-}" ] && active+=("$row"); done

measure_row() { measure "$(tree "${measured[$1]}")" "${port[$1]}" "$secs" "$conns"; }
interleave "$rounds" "$dir/peak" measure_row "${active[@]}"

python3 - "$dir/peak" "${active[@]}" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, *v = line.split()
    rows.setdefault(name, []).append([float(x) for x in v])
order = sys.argv[2:]
med = {n: [statistics.median(r[i] for r in rows[n]) for i in range(5)] + [statistics.median(r[3] + r[4] for r in rows[n]), statistics.median(r[5] for r in rows[n])] for n in order}
# A ratio is the median of the rounds' ratios: the rows of one round ran within a minute or two
# of each other, so most of the machine's drift between rounds cancels.
def paired(n, b):
    return statistics.median((x[3] + x[4]) / (y[3] + y[4]) for x, y in zip(rows[n], rows[b]))
base = "nginx" if "nginx" in rows else order[0]
def nolimits_of(n):
    b = "nolimits-pgo" if n.endswith("-pgo") else "nolimits"
    return f"{paired(n, b):.3f}" if b in rows else "–"
print("| proxy | req/s | p50 ms | p99 ms | user µs/req | sys µs/req | total µs/req | ÷ nginx | ÷ no limits | wrk + upstream µs/req |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in order:
    m = med[n]
    print(f"| {n} | {m[0]:,.0f} | {m[1]:.2f} | {m[2]:.2f} | {m[3]:.1f} | {m[4]:.1f} | {m[5]:.1f} | {paired(n, base):.3f} | {nolimits_of(n)} | {m[6]:.1f} |")
open(sys.argv[1] + ".slowest", "w").write(str(min(m[0] for m in med.values())))
PY
echo "(wrk -t1 -c$conns -d${secs}s, $rounds interleaved rounds, medians (ratios: medians of the rounds' ratios); $threads worker(s) per proxy on CPUs $PROXY_CPUS; wrk, upstream and Redis on CPUs $LOAD_CPUS)"

if command -v oha >/dev/null; then
  rate=$(python3 -c "print(int(float(open('$dir/peak.slowest').read()) / 2))")
  echo
  echo "| proxy at $rate req/s | p50 ms | p99 ms | p99.9 ms |"
  echo "|---|---|---|---|"
  for row in "${active[@]}"; do
    taskset -c "$LOAD_CPUS" oha -z "${secs}s" -q "$rate" -c "$conns" --latency-correction --no-tui \
      --output-format json "http://127.0.0.1:${port[$row]}/" > "$dir/oha.json" 2>/dev/null
    python3 - "$dir/oha.json" "$row" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["latencyPercentiles"]
print(f"| {sys.argv[2]} | {p['p50'] * 1e3:.2f} | {p['p99'] * 1e3:.2f} | {p['p99.9'] * 1e3:.2f} |")
PY
  done
  echo "(oha -q $rate -c$conns -z${secs}s with latency correction: half of the slowest row's peak)"
else
  echo "(fixed-rate run skipped: install oha with 'scripts/setup.sh --bench' or 'cargo install --locked oha')" >&2
fi
