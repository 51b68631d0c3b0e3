#!/usr/bin/env bash
# Build tollgate against stock Pingora 0.9.1 and stock redis 1.8.1: the whole patch set off,
# for a paired run of patched against stock (patches/README.md, "Building against stock
# Pingora").
#
# The feature `stock-pingora` makes src/pingora_patches.rs call stock Pingora's API, but
# Cargo.toml's `[patch.crates-io]` applies whatever the features. So this copies the working
# tree as it is (committed or not, without target/, .git and patches/) to target/stock-src,
# writes there a Cargo.toml without `[patch.crates-io]` and without the patched crates as
# workspace members, lets Cargo re-resolve that copy's Cargo.lock (only the patched crates
# change: they come from crates.io), and builds there. The real Cargo.toml and Cargo.lock are
# never touched.
#
# Usage: scripts/stock-build.sh [--profile NAME] | --check | --tree
#   (none)          `cargo build --profile NAME --features stock-pingora` (default `release`;
#                   `production` is what ships) into target/stock (STOCK_TARGET_DIR overrides),
#                   and print the binary's path.
#   --check         what scripts/test.sh runs: `cargo clippy --all-targets --features
#                   stock-pingora -- -D warnings` on the copy. It shares target/ (or
#                   CARGO_TARGET_DIR) with the default build, so only the stock crates and
#                   tollgate are checked anew.
#   --tree          only prepare the copy and print its path, for any other cargo command
#                   there (run with `--locked --features stock-pingora`).
# RUSTFLAGS and the like pass through, so a PGO stock binary is this script run twice the way
# scripts/pgo.sh runs cargo: `RUSTFLAGS=-Cprofile-generate=DIR STOCK_TARGET_DIR=target/stock-pgo-gen
# scripts/stock-build.sh --profile production`, the training, then `RUSTFLAGS=-Cprofile-use=FILE
# STOCK_TARGET_DIR=target/stock-pgo-use scripts/stock-build.sh --profile production`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
profile=release mode=build
while [ $# -gt 0 ]; do
  case $1 in
    --profile) profile=$2; shift 2 ;;
    --check) mode=check; shift ;;
    --tree) mode=tree; shift ;;
    *) sed -n '2,27p' "$0" >&2; exit 2 ;;
  esac
done

tree=$root/target/stock-src
mkdir -p "$tree"
list=$(mktemp)
manifest=$(mktemp)
trap 'rm -f "$list" "$manifest"' EXIT

# 1. The files: tar keeps their times, so Cargo rebuilds only what changed since the last copy.
files() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard -- ':!patches' ':!Cargo.toml' ':!Cargo.lock'
  else # an export without .git
    find . -type f ! -path './target/*' ! -path './patches/*' ! -path ./Cargo.toml \
      ! -path ./Cargo.lock -printf '%P\0'
  fi
}
files | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\n' "$f"; done | sort >"$list"
tar -cf - --verbatim-files-from -T "$list" | tar -xf - -C "$tree"
# Files since deleted or ignored go from the copy too (a test file left behind would build).
(cd "$tree" && find . -type f ! -name Cargo.toml ! -name Cargo.lock ! -name .lock-source \
  -printf '%P\n' | sort | comm -23 - "$list" | tr '\n' '\0' | xargs -0r rm -f)

# 2. The one-line change: no `[patch.crates-io]` section, no patched crates as members.
awk '
  /^\[patch\.crates-io\]/ { skip = 1; next }
  /^\[/ { skip = 0 }
  skip { next }
  /^members = / { print "members = []"; next }
  { print }
' Cargo.toml >"$manifest"
if grep -v '^[[:space:]]*#' "$manifest" | grep -q 'patches/'; then
  echo "stock-build: the copy's Cargo.toml still names patches/ once [patch.crates-io] and" >&2
  echo "  the members are gone: Cargo.toml's layout changed; update the awk program in $0" >&2
  exit 1
fi
cmp -s "$manifest" "$tree/Cargo.toml" || cp "$manifest" "$tree/Cargo.toml"

# 3. The lock: the real one, re-resolved where the patched crates were (again only when it or
#    the manifest changed). Every build below is --locked to it.
if ! cmp -s Cargo.lock "$tree/.lock-source" || [ "$tree/Cargo.toml" -nt "$tree/Cargo.lock" ]; then
  cp Cargo.lock "$tree/Cargo.lock"
  cargo metadata --quiet --format-version 1 --manifest-path "$tree/Cargo.toml" >/dev/null
  touch "$tree/Cargo.lock"
  cp Cargo.lock "$tree/.lock-source"
fi

# `tollgate --version` names the commit and says the build is stock. Given here, build.rs
# watches no git files, which it would otherwise find changed on every build of the copy.
commit=$(git rev-parse --short=7 HEAD 2>/dev/null || echo unknown)
export TOLLGATE_COMMIT=${TOLLGATE_COMMIT:-"$commit, stock Pingora"}

case $mode in
  tree)
    echo "$tree"
    ;;
  check)
    # A crate from crates.io is built the same in both trees, so the default build's are reused.
    (cd "$tree" && CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target} \
      cargo clippy --all-targets --locked --features stock-pingora -- -D warnings)
    ;;
  build)
    target=${STOCK_TARGET_DIR:-$root/target/stock}
    (cd "$tree" && CARGO_TARGET_DIR=$target \
      cargo build --profile "$profile" --locked --features stock-pingora --bin tollgate >&2)
    case $profile in dev | test) dir=debug ;; bench) dir=release ;; *) dir=$profile ;; esac
    echo "$target/$dir/tollgate"
    ;;
esac
