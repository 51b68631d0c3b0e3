#!/usr/bin/env bash
# Install what building and testing tollgate needs on a fresh Debian/Ubuntu machine with Rust:
# cmake (Pingora's libz-ng-sys), redis-server/redis-sentinel/redis-tools (integration tests),
# faketime (clock-skew test), prometheus with promtool and chromium (observability tests). Does
# nothing for tools already present.
set -euo pipefail

need=()
command -v cmake >/dev/null || need+=(cmake)
if [ "${1:-}" != "--build-only" ]; then
  command -v redis-server >/dev/null || need+=(redis-server)
  command -v redis-cli >/dev/null || need+=(redis-tools)
  command -v redis-sentinel >/dev/null || need+=(redis-sentinel)
  command -v faketime >/dev/null || need+=(faketime)
  command -v openssl >/dev/null || need+=(openssl)
  command -v promtool >/dev/null || need+=(prometheus)
  command -v chromium >/dev/null || need+=(chromium)
fi
[ ${#need[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${need[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
