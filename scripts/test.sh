#!/usr/bin/env bash
# Quick-start command 2: install what the tests need, then run every check and test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --all-targets --locked
