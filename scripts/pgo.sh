#!/usr/bin/env bash
# Build tollgate with profile-guided optimization (PGO): the `production` profile (fat LTO, one
# codegen unit) compiled with a profile of the gateway's own hot paths, which cuts its CPU per
# proxied request by about a sixth (loadtest/log/2026-11-25-pgo.md).
#
# 1. Builds an instrumented gateway (`-Cprofile-generate`, production profile) into
#    target/pgo-gen. The instrumented build must use the profile the final one uses: a profile
#    taken from the release build changed a production build's instructions by 1% where it
#    changes a release build's by 16% (loadtest/log/2026-11-25-pgo.md).
# 2. Trains it on loopback: the gateway's own demo upstream and a redis-server on free ports,
#    then the gateway under `wrk -t1 -c50` for SECONDS (default 5) with each of six configs:
#    no limits; one memory-store limit that never denies; one that denies nearly every request
#    (the 429 path); one Redis-store limit; one memory-store limit with the JSON access log;
#    the bundled gateway.yaml with an API key (tiers, five limits, a shadow limit). Each
#    gateway is stopped with SIGTERM, which makes it write its profile. Paths left out of the
#    training (TLS, Redis Cluster and Sentinel, JWT, quotas) are built as cold code: correct,
#    and optimized for size rather than speed.
# 3. Merges the profiles with the toolchain's own llvm-profdata (`rustup component add
#    llvm-tools`; LLVM_PROFDATA names another of the same LLVM version).
# 4. Builds the `production` profile with `-Cprofile-use` into target/pgo-use and copies the
#    binary to target/pgo/tollgate (beside the profile, target/pgo/tollgate.profdata).
#
# Usage: scripts/pgo.sh [-s SECONDS] [--bare]
#   --bare also builds examples/bare_pingora with the same profile (target/pgo/bare_pingora),
#   for loadtest/proxy.sh's bare-pgo row (the floor, built the same way).
# Needs cmake, wrk, redis-server, curl and python3 (scripts/setup.sh --bench installs them);
# takes two production builds (7 and 5 minutes cold here, on two cores) and about 40 s of
# training.
# Every process it starts is stopped at the end, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=5 bare=""
while [ $# -gt 0 ]; do
  case $1 in
    -s) secs=$2; shift 2 ;;
    --bare) bare=1; shift ;;
    *) sed -n '2,29p' "$0" >&2; exit 2 ;;
  esac
done

# need, free_port, and cleanup of $dir and $pids at exit: the load tests' own.
source loadtest/bench_lib.sh
need cmake cmake; need wrk wrk; need redis-server redis-server; need curl curl; need python3 python3

host=$(rustc -vV | sed -n 's/^host: //p')
profdata=${LLVM_PROFDATA:-$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata}
if [ ! -x "$profdata" ] && [ -z "${LLVM_PROFDATA:-}" ] && command -v rustup >/dev/null; then
  echo "pgo: rustup component add llvm-tools" >&2
  rustup component add llvm-tools >&2
fi
[ -x "$profdata" ] || {
  echo "pgo: no llvm-profdata at $profdata: rustup component add llvm-tools (or LLVM_PROFDATA=...)" >&2
  exit 1
}

dir=$(mktemp -d)
pids=()
trap cleanup EXIT

# `--target` keeps RUSTFLAGS off build scripts and procedural macros: only the gateway's own
# code is instrumented, then optimized.
targets=(--bin tollgate)
[ -n "$bare" ] && targets+=(--example bare_pingora)

# Fixed paths for the profiles, so that the flags stay the same from one run to the next: the
# instrumented build is then incremental. The optimized one is compiled again in full on every
# run, since rustc tracks the profile, which every training changes.
out=$PWD/target/pgo
raw=$out/raw
echo "pgo: 1/4 instrumented build (target/pgo-gen)" >&2
rm -rf "$raw"
mkdir -p "$raw"
RUSTFLAGS="-Cprofile-generate=$raw" CARGO_TARGET_DIR=target/pgo-gen \
  cargo build --profile production --locked --target "$host" "${targets[@]}"
gen=target/pgo-gen/$host/production/tollgate

echo "pgo: 2/4 training, ${secs}s per config" >&2
up=$(free_port) rp=$(free_port)
"$gen" demo-upstream --listen "127.0.0.1:$up" >"$dir/upstream.log" 2>&1 & pids+=($!)
redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >/dev/null & pids+=($!)

base="server: { threads: 1 }
upstreams: { up: [\"127.0.0.1:$up\"] }
routes: [ { name: all, match: { path_prefix: / }, upstream: up } ]"
never='limits: [ { name: per-ip, key: [client_ip], limit: 1000000000, window: 1m } ]'
configs=(
  "$base
access_log: { enabled: false }"
  "$base
$never
access_log: { enabled: false }"
  "$base
limits: [ { name: per-ip, key: [client_ip], limit: 100, window: 1m } ]
access_log: { enabled: false }"
  "$base
store: { backend: redis, url: \"redis://127.0.0.1:$rp\" }
$never
access_log: { enabled: false }"
  "$base
$never
access_log: { format: json, path: \"$dir/access.log\" }"
)

train() { # binary config [wrk options]
  local port admin pid bin=$1 cfg=$2
  shift 2
  port=$(free_port) admin=$(free_port)
  printf '%s\n' "$cfg" >"$dir/gateway.yaml"
  "$bin" -c "$dir/gateway.yaml" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
    >"$dir/gateway.out" 2>"$dir/gateway.log" & pid=$!
  pids+=($pid)
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null && break; sleep 0.5; done
  curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null || {
    echo "pgo: the gateway did not become ready:" >&2; cat "$dir/gateway.log" >&2; exit 1
  }
  wrk -t1 -c50 -d"${secs}s" "$@" "http://127.0.0.1:$port/" | sed -n 's/^Requests\/sec: */  req\/s: /p' >&2
  kill -TERM "$pid"
  wait "$pid" || true
}
for cfg in "${configs[@]}"; do train "$gen" "$cfg"; done
train "$gen" "$(sed "s/127.0.0.1:9000/127.0.0.1:$up/" gateway.yaml)" -H 'x-api-key: demo-pro'
if [ -n "$bare" ]; then
  train "target/pgo-gen/$host/production/examples/bare_pingora" "$base"
fi
# The demo upstream's profile is written when it stops.
kill -TERM "${pids[0]}"
wait "${pids[0]}" || true

echo "pgo: 3/4 merging the profiles" >&2
"$profdata" merge -o "$out/tollgate.profdata" "$raw"/*.profraw

echo "pgo: 4/4 optimized build (target/pgo-use, production profile)" >&2
RUSTFLAGS="-Cprofile-use=$out/tollgate.profdata" CARGO_TARGET_DIR=target/pgo-use \
  cargo build --profile production --locked --target "$host" "${targets[@]}"
install -m 0755 "target/pgo-use/$host/production/tollgate" "$out/tollgate"
if [ -n "$bare" ]; then
  install -m 0755 "target/pgo-use/$host/production/examples/bare_pingora" "$out/bare_pingora"
fi
echo "pgo: built target/pgo/tollgate${bare:+ and target/pgo/bare_pingora}" >&2
