#!/usr/bin/env bash
# Memory per active key in Redis (MEMORY USAGE) for each algorithm, as in docs/stores.md's table.
# Starts its own redis-server on a free loopback port and stops it at the end.
# Usage: loadtest/redis_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source loadtest/redis_lib.sh
redis-server --version
cargo run --release --quiet --example redis_memory -- "redis://127.0.0.1:$port"
