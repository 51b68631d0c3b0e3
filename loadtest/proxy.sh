#!/usr/bin/env bash
# Whole-system throughput: tollgate (no limits, one limit on the memory store, the same limit
# on Redis) against NGINX as a reverse
# proxy, in the same run, same layout: the proxy under test pinned to core 0, the upstream
# (NGINX `return 200`) and wrk on core 1. Every process is started here on free loopback ports
# and stopped at the end. Prints req/s, p99 and the ratio to NGINX.
# Usage: loadtest/proxy.sh [seconds] [connections]     (needs nginx, wrk, redis-server)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-50}
for t in nginx wrk redis-server taskset; do
  command -v $t >/dev/null || { echo "needs $t: apt-get install -y nginx wrk redis-server util-linux" >&2; exit 1; }
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

cargo build --release --quiet
bin=target/release/tollgate
up=$(free_port); ngx=$(free_port); gw=$(free_port); gwr=$(free_port); gwn=$(free_port); rp=$(free_port)

mkdir -p "$dir/logs"
cat > "$dir/upstream.conf" <<CONF
worker_processes 1; daemon off; pid $dir/up.pid; error_log $dir/logs/up.err;
events { worker_connections 4096; }
http { access_log off;
  server { listen 127.0.0.1:$up; keepalive_requests 100000; location / { return 200 "ok"; } } }
CONF
cat > "$dir/proxy.conf" <<CONF
worker_processes 1; daemon off; pid $dir/px.pid; error_log $dir/logs/px.err;
events { worker_connections 4096; }
http { access_log off;
  upstream up { server 127.0.0.1:$up; keepalive 64; }
  server { listen 127.0.0.1:$ngx; keepalive_requests 100000;
    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
CONF
cat > "$dir/gateway.yaml" <<CONF
server: { threads: 1 }
upstreams: { up: ["127.0.0.1:$up"] }
routes: [ { name: all, match: { path_prefix: / }, upstream: up } ]
limits:
  - { name: per-ip, key: [client_ip], limit: 1000000000, window: 1m }
CONF
cat > "$dir/nolimits.yaml" <<CONF
server: { threads: 1 }
upstreams: { up: ["127.0.0.1:$up"] }
routes: [ { name: all, match: { path_prefix: / }, upstream: up } ]
CONF
taskset -c 1 nginx -p "$dir" -c "$dir/upstream.conf" & pids+=($!)
taskset -c 0 nginx -p "$dir" -c "$dir/proxy.conf" & pids+=($!)
taskset -c 0 "$bin" -c "$dir/gateway.yaml" --listen "127.0.0.1:$gw" --admin-listen "127.0.0.1:$(free_port)" 2>"$dir/gw.log" & pids+=($!)
taskset -c 0 "$bin" -c "$dir/nolimits.yaml" --listen "127.0.0.1:$gwn" --admin-listen "127.0.0.1:$(free_port)" 2>"$dir/gwn.log" & pids+=($!)
taskset -c 1 redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >/dev/null & pids+=($!)
sleep 1
taskset -c 0 "$bin" -c "$dir/gateway.yaml" --listen "127.0.0.1:$gwr" --admin-listen "127.0.0.1:$(free_port)" --redis-url "redis://127.0.0.1:$rp" 2>"$dir/gwr.log" & pids+=($!)
sleep 1.5

run() { # name port
  local out rps p99
  out=$(taskset -c 1 wrk -t 1 -c "$conns" -d "${secs}s" --latency "http://127.0.0.1:$2/" 2>&1)
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $4}')
  echo "$1 $rps $p99 ${non2xx:-0}"
}
taskset -c 1 wrk -t 1 -c "$conns" -d 2s "http://127.0.0.1:$gw/" >/dev/null   # warm-up
res_ngx=$(run nginx-proxy "$ngx")
res_gwn=$(run tollgate-nolimits "$gwn")
res_gw=$(run tollgate-memory "$gw")
res_gwr=$(run tollgate-redis "$gwr")
res_ngx2=$(run nginx-proxy "$ngx")
printf '%-17s %12s %10s %8s %14s\n' proxy req_per_s p99 non2xx ratio_to_nginx
ngx_avg=$(python3 -c "print(($(echo "$res_ngx" | cut -d' ' -f2) + $(echo "$res_ngx2" | cut -d' ' -f2)) / 2)")
for r in "$res_ngx" "$res_gwn" "$res_gw" "$res_gwr" "$res_ngx2"; do
  set -- $r
  printf '%-17s %12s %10s %8s %14s\n' "$1" "$2" "$3" "$4" "$(python3 -c "print(f'{$2/$ngx_avg:.2f}')")"
done
echo "(wrk -t1 -c$conns -d${secs}s; proxies on core 0, upstream/wrk/redis on core 1; ratio against the mean of the two NGINX runs)"
