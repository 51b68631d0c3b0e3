#!/usr/bin/env bash
# The tollgate fleet on loopback, without containers: redis-server, the demo upstream, two
# gateways and HAProxy in front of them, started from the same files docker/compose.yaml uses
# (docker/gateway.yaml, docker/haproxy.cfg). Only the environment differs: loopback addresses
# and free ports instead of container names.
#
#   docker/fleet.sh [--dir DIR] [--bin PATH]
#
#   --dir DIR   where logs, pid files and fleet.env go (default: a new /tmp/tollgate-fleet.*)
#   --bin PATH  the tollgate binary (default: target/release/tollgate, else target/debug/tollgate)
#   FLEET_LB_PORT=8080 picks the balancer's port (default: a free one). Any other TOLLGATE_*
#   variable set here reaches both gateways (TOLLGATE_FREE_LIMIT=50, TOLLGATE_GRACE_PERIOD=2s).
#
# It runs in the foreground until Ctrl-C or SIGTERM, which stop every process it started.
# When everything answers it writes DIR/fleet.env (addresses and pids, what the tests read) and
# DIR/gateway-N.env (that gateway's environment), and prints the addresses.
# Needs haproxy, redis-server and redis-cli (scripts/setup.sh installs them).
#
# Restart or upgrade gateway N by hand (docs/deployment.md, "Rolling restart" and "Binary upgrade"; tests/fleet.rs does both under load):
#   kill -TERM "$(cat DIR/gateway-N.pid)"      # drains, then exits; start it again with:
#   env $(cat DIR/gateway-N.env) tollgate --config docker/gateway.yaml
#   env $(cat DIR/gateway-N.env) tollgate --upgrade --config docker/gateway.yaml &
#   kill -QUIT "$(cat DIR/gateway-N.pid)"      # within 5 s: hands the sockets over, drains, exits
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

dir="" bin=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "fleet: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "fleet: $*" >&2; exit 1; }
for tool in haproxy redis-server redis-cli; do
  command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup.sh (apt-get install haproxy redis-server redis-tools)"
done
if [ -z "$bin" ]; then
  for b in "$repo/target/release/tollgate" "$repo/target/debug/tollgate"; do
    [ -x "$b" ] && { bin=$b; break; }
  done
  [ -n "$bin" ] || die "no tollgate binary: cargo build --release (or pass --bin PATH)"
fi
[ -x "$bin" ] || die "$bin is not an executable"
if [ -z "$dir" ]; then dir=$(mktemp -d /tmp/tollgate-fleet.XXXXXX); else mkdir -p "$dir"; fi
dir=$(cd "$dir" && pwd)

pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # The gateways drain (drain_period, 5 s by default) and finish in flight (grace_period).
  for _ in $(seq 300); do
    alive=""
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A TCP port on 127.0.0.1 that nothing listens on now and this script has not picked yet,
# below the ephemeral range (where an outgoing connection may hold the port without listening).
read -r ephemeral_low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || ephemeral_low=32768
picked=" "
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((10000 + RANDOM % (${ephemeral_low:-32768} - 10000)))
    case "$picked" in *" $p "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      picked="$picked$p "
      echo "$p"
      return
    fi
  done
  die "no free port found"
}

# start NAME COMMAND...: run in the background, output to DIR/NAME.log, pid to DIR/NAME.pid.
start() {
  local name=$1
  shift
  "$@" >"$dir/$name.log" 2>&1 &
  pids+=($!)
  echo $! >"$dir/$name.pid"
}

# wait_for NAME CHECK...: until CHECK succeeds (at most 20 s), while NAME is still running.
wait_for() {
  local name=$1 pid
  shift
  pid=$(cat "$dir/$name.pid")
  for _ in $(seq 200); do
    "$@" >/dev/null 2>&1 && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -20 "$dir/$name.log" >&2
      die "$name exited before it answered (log: $dir/$name.log)"
    fi
    sleep 0.1
  done
  tail -20 "$dir/$name.log" >&2
  die "$name did not answer within 20 s (log: $dir/$name.log)"
}

# HAProxy connects to the gateways from its own loopback address, the one they trust
# X-Forwarded-For from: clients on 127.0.0.1 that reach a gateway directly are not believed.
lb_source=127.0.0.2
redis=$(free_port) upstream=$(free_port) lb=${FLEET_LB_PORT:-$(free_port)} stats=$(free_port)
gw=("" "$(free_port)" "$(free_port)") admin=("" "$(free_port)" "$(free_port)")

start redis redis-server --port "$redis" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir"
start upstream "$bin" demo-upstream --listen "127.0.0.1:$upstream"
wait_for redis redis-cli -p "$redis" ping
wait_for upstream "$bin" health --url "http://127.0.0.1:$upstream/__demo/stats"

for n in 1 2; do
  cat >"$dir/gateway-$n.env" <<EOF
TOLLGATE_LISTEN=127.0.0.1:${gw[$n]}
TOLLGATE_ADMIN_LISTEN=127.0.0.1:${admin[$n]}
TOLLGATE_UPSTREAM=127.0.0.1:$upstream
TOLLGATE_REDIS_URL=redis://127.0.0.1:$redis/0
TOLLGATE_TRUSTED_PROXY=$lb_source/32
TOLLGATE_UPGRADE_SOCK=$dir/gateway-$n.upgrade.sock
EOF
  # shellcheck disable=SC2046 # one NAME=VALUE word per line of the file
  start "gateway-$n" env $(cat "$dir/gateway-$n.env") "$bin" --config "$repo/docker/gateway.yaml"
done
for n in 1 2; do
  wait_for "gateway-$n" "$bin" health --url "http://127.0.0.1:${admin[$n]}/readyz"
done

start haproxy env \
  TOLLGATE_LB_BIND="127.0.0.1:$lb" TOLLGATE_LB_STATS_BIND="127.0.0.1:$stats" \
  TOLLGATE_GATEWAY_1="127.0.0.1:${gw[1]}" TOLLGATE_GATEWAY_1_ADMIN_PORT="${admin[1]}" \
  TOLLGATE_GATEWAY_2="127.0.0.1:${gw[2]}" TOLLGATE_GATEWAY_2_ADMIN_PORT="${admin[2]}" \
  TOLLGATE_LB_SOURCE="$lb_source" \
  haproxy -db -f "$repo/docker/haproxy.cfg"
wait_for haproxy "$bin" health --url "http://127.0.0.1:$lb/lb-health"

cat >"$dir/fleet.env.new" <<EOF
FLEET_DIR=$dir
FLEET_BIN=$bin
FLEET_CONFIG=$repo/docker/gateway.yaml
FLEET_LB=127.0.0.1:$lb
FLEET_LB_STATS=127.0.0.1:$stats
FLEET_REDIS=127.0.0.1:$redis
FLEET_UPSTREAM=127.0.0.1:$upstream
FLEET_GATEWAY_1=127.0.0.1:${gw[1]}
FLEET_GATEWAY_1_ADMIN=127.0.0.1:${admin[1]}
FLEET_GATEWAY_2=127.0.0.1:${gw[2]}
FLEET_GATEWAY_2_ADMIN=127.0.0.1:${admin[2]}
FLEET_REDIS_PID=$(cat "$dir/redis.pid")
FLEET_UPSTREAM_PID=$(cat "$dir/upstream.pid")
FLEET_GATEWAY_1_PID=$(cat "$dir/gateway-1.pid")
FLEET_GATEWAY_2_PID=$(cat "$dir/gateway-2.pid")
FLEET_HAPROXY_PID=$(cat "$dir/haproxy.pid")
EOF
mv "$dir/fleet.env.new" "$dir/fleet.env"

cat <<EOF
tollgate fleet on loopback (logs, pids and fleet.env in $dir):
  balancer   http://127.0.0.1:$lb      stats http://127.0.0.1:$stats/stats
  gateway-1  http://127.0.0.1:${gw[1]}     admin http://127.0.0.1:${admin[1]}/readyz
  gateway-2  http://127.0.0.1:${gw[2]}     admin http://127.0.0.1:${admin[2]}/readyz
  redis      127.0.0.1:$redis          upstream http://127.0.0.1:$upstream
Try: curl -i -H 'x-api-key: demo-free' http://127.0.0.1:$lb/hello
Ctrl-C stops everything.
EOF
# Until a signal: a gateway that dies (or is killed by a test) leaves the rest running.
wait
