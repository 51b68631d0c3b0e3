# Sourced by the whole-system load tests (proxy.sh, cpu.sh, profile.sh, paired.sh, instructions.sh). Defines:
#   free_port                 a free loopback port
#   need TOOL "apt package"   fail with what to install when TOOL is missing
#   tree PID                  PID and its children (NGINX's master and workers)
#   ticks PID...              CPU ticks (user system) of every thread of these processes:
#                             /proc/PID/task/*/stat, fields after the closing parenthesis (thread
#                             names such as "tollgate proxy" contain spaces)
#   measure PIDS PORT SECS CONNS
#                             wrk -t1 -cCONNS for SECS (after a 2 s warm-up) against PORT on
#                             $LOAD_CPUS, and the CPU of PIDS meanwhile; prints
#                             "req_per_s p50_ms p99_ms user_us_per_req sys_us_per_req
#                             load_us_per_req" (the last: wrk's and the upstream's own CPU)
#   upstream_nginx PORT DIR   NGINX `return 200` on $LOAD_CPUS (the upstream of every proxy)
#   nginx_proxy PORT WORKERS  NGINX as the peer reverse proxy on $PROXY_CPUS, in front of $up:
#                             upstream keep-alive, `limit_req` with a zone that never denies,
#                             no access log; its master's PID is $!
# WRK_SCRIPT, when set, is a wrk Lua script every measured run uses (for example
# loadtest/configs/many-keys.lua: 10,000 distinct x-k header values).
# Where things run: PROXY_CPUS (default 0) for the measured proxies, LOAD_CPUS (default 1) for
# wrk, the upstream and Redis, as taskset CPU lists. PROXY_CPUS=0,1 LOAD_CPUS=0,1 shares both
# cores between everything (for proxies with two threads or workers).
#   start_redis               a redis-server on $LOAD_CPUS, its port in $rp
#   redis_if_named ROW...     when a ROW's config (LABEL=BINARY=CONFIG) names __REDIS__, start a
#                             redis-server on $LOAD_CPUS and set $rp to its port (else rp="")
#   gateway_config ROW_CFG OUT  CONFIG with __UPSTREAM__, __TMP__ and __REDIS__ filled in
#   start_gateway LABEL BINARY CONFIG [FLAGS]
#                             a gateway on $PROXY_CPUS with CONFIG (as gateway_config) on a free
#                             port, set in $port; its stderr $dir/LABEL.log, its stdout (an
#                             access log on stdout) $dir/LABEL.out; its PID is $!
#   start_bench               a temporary directory $dir and an array $pids, both cleaned up
#                             on exit, and the upstream on 127.0.0.1:$up
#   start_rows ROW...         every ROW (nginx: nginx_proxy with one worker; or
#                             LABEL=BINARY=CONFIG[=FLAGS]: start_gateway), and a Redis first when
#                             a gateway row's config names __REDIS__; sets labels (in order),
#                             ports[LABEL] and procs[LABEL] (the PID started)
# Every process started here is appended to the caller's `pids` array, for its EXIT trap.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
need() { command -v "$1" >/dev/null || { echo "needs $1: scripts/setup.sh --bench (or apt-get install -y $2)" >&2; exit 1; }; }
tree() { echo "$1" $(pgrep -P "$1" 2>/dev/null || true); }
ticks() {
  local p
  for p in "$@"; do cat /proc/"$p"/task/*/stat 2>/dev/null; done |
    sed 's/.*) //' | awk '{u += $12; s += $13} END {print u + 0, s + 0}'
}
hz=$(getconf CLK_TCK)
PROXY_CPUS=${PROXY_CPUS:-0}
LOAD_CPUS=${LOAD_CPUS:-1}
up_pid=""

# wrk's latency figure ("1.23ms", "950.00us", "1.02s") in ms.
to_ms() { python3 -c "import sys,re; v=sys.argv[1]; m=re.match(r'([0-9.]+)(us|ms|s)\$', v); print(f'{float(m[1])*{\"us\":0.001,\"ms\":1,\"s\":1000}[m[2]]:.3f}')" "$1"; }

measure() { # "PIDS" PORT SECS CONNS
  local pids=$1 port=$2 secs=$3 conns=$4 before after up0 up1 out reqs p50 p99 wrk_ticks
  taskset -c "$LOAD_CPUS" wrk -t1 -c "$conns" -d 2s ${WRK_SCRIPT:+-s "$WRK_SCRIPT"} "http://127.0.0.1:$port/" >/dev/null
  # shellcheck disable=SC2086
  before=$(ticks $pids)
  # shellcheck disable=SC2046
  up0=$(ticks $(tree "$up_pid"))
  # wrk's own CPU: the children's times of a shell that waited for it (the stat fields cutime
  # and cstime, 14 and 15 after the closing parenthesis), printed on the last line.
  out=$(sh -c 'taskset -c "$1" wrk -t1 -c "$2" -d "$3s" --latency ${5:+-s "$5"} "http://127.0.0.1:$4/"; sed "s/.*) //" /proc/$$/stat | cut -d" " -f14,15' \
    sh "$LOAD_CPUS" "$conns" "$secs" "$port" "${WRK_SCRIPT:-}")
  # shellcheck disable=SC2086
  after=$(ticks $pids)
  # shellcheck disable=SC2046
  up1=$(ticks $(tree "$up_pid"))
  wrk_ticks=$(echo "$out" | tail -1)
  if echo "$out" | grep -q 'Non-2xx'; then echo "port $port answered non-2xx:" >&2; echo "$out" >&2; exit 1; fi
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  p50=$(to_ms "$(echo "$out" | awk '$1=="50%" {print $2}')")
  p99=$(to_ms "$(echo "$out" | awk '$1=="99%" {print $2}')")
  python3 - "$before" "$after" "$reqs" "$secs" "$hz" "$p50" "$p99" "$up0" "$up1" "$wrk_ticks" <<'PY'
import sys
b, a = sys.argv[1].split(), sys.argv[2].split()
reqs, secs, hz = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
us = 1e6 / hz
u0, u1, w = sys.argv[8].split(), sys.argv[9].split(), sys.argv[10].split()
load = sum(int(x) for x in u1) - sum(int(x) for x in u0) + sum(int(x) for x in w)
print(f"{reqs / secs:.0f} {sys.argv[6]} {sys.argv[7]} {(int(a[0]) - int(b[0])) * us / reqs:.2f} {(int(a[1]) - int(b[1])) * us / reqs:.2f} {load * us / reqs:.2f}")
PY
}

upstream_nginx() { # PORT DIR
  mkdir -p "$2/logs"
  cat > "$2/upstream.conf" <<CONF
worker_processes 1; daemon off; pid $2/up.pid; error_log $2/logs/up.err;
events { worker_connections 8192; }
http { access_log off;
  server { listen 127.0.0.1:$1 backlog=4096; keepalive_requests 10000000; location / { return 200 "ok"; } } }
CONF
  taskset -c "$LOAD_CPUS" nginx -p "$2" -c "$2/upstream.conf" & pids+=($!)
  up_pid=$!
}

nginx_proxy() { # PORT WORKERS
  cat > "$dir/nginx.conf" <<CONF
worker_processes $2; daemon off; pid $dir/nginx.pid; error_log $dir/logs/nginx.err;
events { worker_connections 8192; }
http { access_log off;
  limit_req_zone \$binary_remote_addr zone=perip:10m rate=100000000r/s;
  upstream up { server 127.0.0.1:$up; keepalive 64; }
  server { listen 127.0.0.1:$1 backlog=4096; keepalive_requests 10000000;
    location / { limit_req zone=perip burst=100000000 nodelay;
      proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
CONF
  taskset -c "$PROXY_CPUS" nginx -p "$dir" -c "$dir/nginx.conf" & pids+=($!)
}

# interleave ROUNDS OUTFILE FN ROW...: ROUNDS rounds over the rows, forward in odd rounds and
# backward in even ones (A-B-...-B-A), appending "ROW $(FN ROW)" to OUTFILE for each.
interleave() {
  local rounds=$1 out=$2 fn=$3 r row
  shift 3
  local rows=("$@") order
  for r in $(seq "$rounds"); do
    order=("${rows[@]}")
    if [ $((r % 2)) -eq 0 ]; then mapfile -t order < <(printf '%s\n' "${rows[@]}" | tac); fi
    for row in "${order[@]}"; do
      echo "$row $("$fn" "$row")" >> "$out"
      echo "round $r: $row" >&2
    done
  done
}

cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
start_bench() {
  dir=$(mktemp -d)
  pids=()
  trap cleanup EXIT
  up=$(free_port)
  upstream_nginx "$up" "$dir"
}

start_redis() {
  need redis-server redis-server
  rp=$(free_port)
  taskset -c "$LOAD_CPUS" redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$dir" >/dev/null & pids+=($!)
}

redis_if_named() {
  rp=""
  local row label bin cfg
  for row in "$@"; do
    IFS== read -r label bin cfg _ <<<"$row"
    if grep -q __REDIS__ "$cfg"; then
      start_redis
      return
    fi
  done
}

gateway_config() { # CONFIG OUT
  sed "s/__UPSTREAM__/127.0.0.1:$up/; s|__TMP__|$dir|; s/__REDIS__/127.0.0.1:${rp:-0}/" "$1" > "$2"
}

start_gateway() { # LABEL BINARY CONFIG [FLAGS]
  port=$(free_port)
  gateway_config "$3" "$dir/$1.yaml"
  # shellcheck disable=SC2086
  taskset -c "$PROXY_CPUS" "$2" ${4:-} -c "$dir/$1.yaml" --listen "127.0.0.1:$port" \
    --admin-listen "127.0.0.1:$(free_port)" >"$dir/$1.out" 2>"$dir/$1.log" & pids+=($!)
}

start_rows() { # ROW...
  local row bin cfg flags gateway_rows=()
  for row in "$@"; do [ "$row" = nginx ] || gateway_rows+=("$row"); done
  redis_if_named "${gateway_rows[@]}"
  labels=()
  declare -gA ports procs
  for row in "$@"; do
    if [ "$row" = nginx ]; then
      label=nginx port=$(free_port)
      nginx_proxy "$port" 1
    else
      IFS== read -r label bin cfg flags <<<"$row"
      start_gateway "$label" "$bin" "$cfg" "${flags:-}"
    fi
    labels+=("$label") ports[$label]=$port procs[$label]=$!
  done
}
