#!/usr/bin/env bash
# User-space instructions per proxied request, counted by valgrind's callgrind: repeatable on a
# busy machine (it counts instructions, not time), so it shows what tollgate adds above the
# bare Pingora proxy even when the CPU-time figures of proxy.sh drift. Kernel time (the
# syscalls) is not in it: proxy.sh measures that.
#
# Each row runs under callgrind twice, serving N1 and then N2 requests over one keep-alive
# connection from a small client (not measured); instructions per request =
# (total(N2) − total(N1)) / (N2 − N1), so start-up and shut-down cancel out. Also writes the
# N2 profile of each row to $OUT_DIR (callgrind_annotate it to see where the instructions go).
#
# Usage: loadtest/instructions.sh [N1] [N2]        (default 300 1300)
#        ROWS="bare nolimits memory" OUT_DIR=/tmp/profiles loadtest/instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
n1=${1:-300} n2=${2:-1300}
rows=(${ROWS:-bare nolimits memory})
out_dir=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out_dir"
source loadtest/bench_lib.sh
need valgrind valgrind; need nginx nginx; need python3 python3
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
cargo build --release --quiet --bin tollgate --example bare_pingora
up=$(free_port)
upstream_nginx "$up" "$dir"

# `n` GETs over one keep-alive connection; fails unless every answer is 200.
client() { # port n
  python3 - "$1" "$2" <<'PY'
import http.client, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
for _ in range(600):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30); c.request("GET", "/warm"); c.getresponse().read(); break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("the proxy did not come up")
for i in range(n):
    c.request("GET", f"/r/{i}"); r = c.getresponse(); r.read()
    if r.status != 200: sys.exit(f"answer {r.status}")
PY
}

run() { # row n -> total instructions
  local row=$1 n=$2 port cmd file
  port=$(free_port); file="$dir/$row.$n.out"
  printf 'server: { threads: 1 }\nupstreams: { up: ["127.0.0.1:%s"] }\nroutes: [ { name: all, match: { path_prefix: / }, upstream: up } ]\n' "$up" > "$dir/$row.yaml"
  [ "$row" = memory ] && echo 'limits: [ { name: per-ip, key: [client_ip], limit: 1000000000, window: 1m } ]' >> "$dir/$row.yaml"
  case $row in
    bare) cmd=(target/release/examples/bare_pingora "127.0.0.1:$port" "127.0.0.1:$up" 1) ;;
    *) cmd=(target/release/tollgate -c "$dir/$row.yaml" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$(free_port)") ;;
  esac
  valgrind --tool=callgrind --callgrind-out-file="$file" "${cmd[@]}" >"$dir/$row.log" 2>&1 &
  local pid=$!
  client "$port" "$n"
  kill -TERM "$pid"; wait "$pid" || true
  [ "$n" = "$n2" ] && cp "$file" "$out_dir/$row.callgrind"
  awk '/^(summary|totals):/ {print $2; exit}' "$file"
}

echo "| row | instructions per request | ÷ bare |"
echo "|---|---|---|"
base=""
for row in "${rows[@]}"; do
  a=$(run "$row" "$n1"); b=$(run "$row" "$n2")
  per=$(( (b - a) / (n2 - n1) ))
  base=${base:-$per}
  echo "| $row | $per | $(python3 -c "print(f'{$per/$base:.2f}')") |"
done
echo "(valgrind --tool=callgrind, user space only; ($n2 − $n1) requests over one keep-alive connection; profiles in $out_dir)"
