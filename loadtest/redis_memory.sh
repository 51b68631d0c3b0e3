#!/usr/bin/env bash
# Memory per active key in Redis (MEMORY USAGE) for each algorithm, as in the README's table.
# Starts its own redis-server on a free loopback port and stops it at the end.
# Usage: loadtest/redis_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "needs redis-server (scripts/setup.sh)" >&2; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >/dev/null &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 50); do [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && break; sleep 0.1; done
redis-server --version
cargo run --release --quiet --example redis_memory -- "redis://127.0.0.1:$port"
