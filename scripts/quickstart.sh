#!/usr/bin/env bash
# Quick-start command 1: install build tools, build tollgate, and run it with the bundled
# gateway.yaml (memory store) in front of the bundled demo upstream on 127.0.0.1:9000.
# Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --build-only
cargo build --release --locked
bin=target/release/tollgate
"$bin" demo-upstream --listen 127.0.0.1:9000 &
upstream=$!
trap 'kill "$upstream" 2>/dev/null || true' EXIT
cat >&2 <<'TXT'

tollgate: proxy on http://127.0.0.1:8080, admin on http://127.0.0.1:9901, demo upstream on :9000
Try, in another terminal:
  for i in $(seq 7); do curl -s -o /dev/null -w '%{http_code}\n' localhost:8080/hello; done   # anonymous: 5 per minute per IP
  curl -i localhost:8080/hello                                  # 429 with Retry-After and RateLimit headers
  curl -i -H 'x-api-key: demo-free' localhost:8080/hello        # free tier: 10 per minute
  curl -i -H 'x-api-key: demo-pro' localhost:8080/hello         # pro tier: 1000 per minute
  curl -s localhost:9901/readyz
TXT
"$bin" --config gateway.yaml
