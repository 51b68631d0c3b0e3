# Sourced by the Redis load tests. Starts a redis-server pinned to core 0 on a free loopback
# port (stopped on exit) and defines:
#   cli ARGS...            redis-cli against it
#   bench SCRIPT KEY ARGS  redis-benchmark (core 1, 50 clients, -P 16, $n requests, 10,000
#                          random keys) running EVALSHA of SCRIPT; sets usec (usec_per_call
#                          from INFO commandstats) and rb (requests/s)
#   median                 the median of the numbers on stdin
command -v redis-server >/dev/null || { echo "needs redis-server and redis-tools (scripts/setup.sh)" >&2; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis_dir=$(mktemp -d)
taskset -c 0 redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$redis_dir" >/dev/null &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null; rm -rf "$redis_dir"' EXIT
cli() { redis-cli -p "$port" "$@"; }
for _ in $(seq 50); do [ "$(cli PING 2>/dev/null)" = PONG ] && break; sleep 0.1; done

bench() {
  local sha out
  sha=$(cli SCRIPT LOAD "$1"); shift
  cli FLUSHALL >/dev/null; cli CONFIG RESETSTAT >/dev/null
  out=$(taskset -c 1 redis-benchmark -p "$port" -c 50 -P 16 -n "$n" -r 10000 -q \
        EVALSHA "$sha" 1 "$@" 2>/dev/null | tr '\r' '\n' | grep -E 'requests per second' | tail -1)
  rb=$(echo "$out" | grep -oE '[0-9]+(\.[0-9]+)? requests per second' | grep -oE '^[0-9.]+')
  usec=$(cli INFO commandstats | grep -E '^cmdstat_evalsha:' | sed -E 's/.*usec_per_call=([0-9.]+).*/\1/')
  cli FLUSHALL >/dev/null
}

median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
