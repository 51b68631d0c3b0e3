#!/usr/bin/env bash
# Upstream's own unit tests of pingora-core, pingora-proxy and pingora-timeout, run on the
# patched copies (patches/README.md): every test that passes on the published crates must pass
# on the patched ones, and every test of the patched crates must pass.
#
# Each side is a workspace under target/upstream-tests/<side>/ holding the five Pingora
# crates as published 0.9.1 (cargo fetches them, as scripts/verify-patches.sh does); the
# patched side has the files of each patches/<crate>/ copy laid over its release (a copy holds
# only Cargo.toml, LICENSE and src/, so the release's examples and benches stay for cargo to
# find). The workspace manifest and lock files are patches/upstream-tests/: the suites'
# dev-dependencies stay out of tollgate's Cargo.lock, and runs are `--locked`.
#
# Tests that cannot pass here (they need the internet) are skipped by exact name, each with its
# reason, in patches/upstream-tests/skip.txt. The published side's results change only with
# its lock file, the skip list or the compiler, so they are kept in
# patches/upstream-tests/stock-passes.txt under a key of those three: the published crates are
# built and tested again only when the key no longer matches (or with --stock), which halves
# the time this takes in CI.
#
# --stock: test the published crates too, whatever the key, and rewrite stock-passes.txt.
# --miri: run the Miri tests, whatever the key (below), and rewrite miri-passes.txt.
# --write-locks: re-resolve both lock files (seeded with tollgate's Cargo.lock, so shared
# dependencies keep the versions tollgate ships with), then test as with --stock and --miri.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
mode=${1:-}
case $mode in
  "" | --stock | --miri | --write-locks) ;;
  *) echo "usage: $0 [--stock | --miri | --write-locks]" >&2; exit 2 ;;
esac
dir=patches/upstream-tests
work=$top/target/upstream-tests
export CARGO_TARGET_DIR=$work/target
crates="pingora-core pingora-proxy pingora-timeout pingora-http pingora-pool"
tested="pingora-core pingora-proxy pingora-timeout"
version=0.9.1

# The published sources, through a throwaway package that depends on each release exactly.
mkdir -p "$work/fetch"
{
  printf '[package]\nname = "fetch-published"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n[lib]\npath = "lib.rs"\n[dependencies]\n'
  for c in $crates; do printf '%s = "=%s"\n' "$c" "$version"; done
  printf '[workspace]\n'
} >"$work/fetch/Cargo.toml"
touch "$work/fetch/lib.rs"
(cd "$work/fetch" && cargo fetch --quiet)
registry=$(cargo metadata --quiet --format-version 1 --manifest-path "$work/fetch/Cargo.toml" |
  python3 -c 'import json, sys
for p in json.load(sys.stdin)["packages"]:
    print(p["name"], p["version"], p["manifest_path"].rsplit("/", 1)[0])')

# One side's workspace, made anew each run; `cp -a` keeps the files' times, so cargo rebuilds
# only what changed.
prepare() {
  local side=$1 ws=$work/$1 c src
  rm -rf "$ws"
  mkdir -p "$ws/$side"
  sed "s|SIDE/|$side/|g" "$dir/Cargo.toml" >"$ws/Cargo.toml"
  for c in $crates; do
    src=$(awk -v n="$c" -v v="$version" '$1 == n && $2 == v { print $3 }' <<<"$registry")
    [ -n "$src" ] || { echo "upstream-tests: $c $version not found by cargo" >&2; exit 1; }
    cp -a "$src" "$ws/$side/$c"
    [ "$side" = patched ] && cp -a "patches/$c/." "$ws/$side/$c/"
  done
  if [ "$mode" = --write-locks ]; then
    cp Cargo.lock "$ws/Cargo.lock"
    cargo metadata --quiet --format-version 1 --manifest-path "$ws/Cargo.toml" >/dev/null
    cp "$ws/Cargo.lock" "$dir/$side.lock"
    echo "upstream-tests: wrote $dir/$side.lock"
  else
    cp "$dir/$side.lock" "$ws/Cargo.lock"
  fi
}

# The skip list as `--skip NAME` arguments (names are exact, `--exact`), one a line in
# skip.txt as `crate test::path  # reason`.
skips=()
while read -r crate name _; do
  [ -n "$name" ] && skips+=(--skip "$name")
done < <(sed -e 's/#.*//' "$dir/skip.txt")

# The tests run in a network namespace of their own with only a loopback interface, so that a
# test that reaches for the internet fails here (and goes to the skip list with its reason)
# instead of passing by the grace of the network it happens to run on.
isolate=(unshare -n)
[ "$(id -u)" -eq 0 ] || isolate=(unshare -rn)
isolate+=(sh -c 'ip link set lo up && exec "$@"' isolate)
"${isolate[@]}" true || {
  echo "upstream-tests: cannot make a network namespace with \`${isolate[*]}\` (needs unshare" \
    "of util-linux, ip of iproute2, and root or unprivileged user namespaces)" >&2
  exit 1
}

# Run one side's library tests; its results go to $work/<side>.results as `crate test result`.
run() {
  local side=$1 log=$work/$1.log pkgs=() c status
  for c in $tested; do pkgs+=(-p "$c"); done
  echo "upstream-tests: $side: cargo test --lib ${pkgs[*]}" >&2
  set +e
  # Built first with the network (cargo may fetch), then run without it.
  (cd "$work/$side" && nice cargo test --locked --lib --no-run "${pkgs[@]}" &&
    "${isolate[@]}" nice cargo test --locked --offline --lib --no-fail-fast "${pkgs[@]}" -- \
      --exact "${skips[@]}") >"$log" 2>&1
  status=$?
  set -e
  # `Running unittests src/lib.rs (.../deps/pingora_core-<hash>)` names each binary's crate.
  awk '/Running unittests/ { c = $NF; sub(/.*\//, "", c); sub(/-[0-9a-f]+\)$/, "", c); gsub(/_/, "-", c) }
       /^test .* \.\.\. (ok|FAILED|ignored)/ { r = $NF; print c, $2, r }' "$log" |
    LC_ALL=C sort >"$work/$side.results"
  grep '^test result:' "$log" >&2 || true
  if [ "$status" -ne 0 ]; then
    grep -E '^test .* FAILED$|^error' "$log" >&2 || tail -30 "$log" >&2
    echo "upstream-tests: $side: cargo test failed (log: $log)" >&2
  fi
  return "$status"
}

key=$( {
  cat "$dir/stock.lock" "$dir/skip.txt"
  rustc -V
} | sha256sum | cut -c1-16)
status=0
stock_list=$dir/stock-passes.txt
if [ "$mode" = --stock ] || [ "$mode" = --write-locks ] ||
  [ "$(head -1 "$stock_list" 2>/dev/null)" != "# key $key" ]; then
  prepare stock
  run stock || status=1
  if [ "$mode" = --write-locks ]; then
    key=$( {
      cat "$dir/stock.lock" "$dir/skip.txt"
      rustc -V
    } | sha256sum | cut -c1-16)
  fi
  {
    echo "# key $key"
    echo "# The published crates' library tests that pass, from scripts/upstream-tests.sh; the"
    echo "# key hashes stock.lock, skip.txt and \`rustc -V\`: when it changes, they run again."
    awk '$3 == "ok" { print $1, $2 }' "$work/stock.results"
  } >"$stock_list"
  echo "upstream-tests: wrote $stock_list" >&2
fi
prepare patched
run patched || status=1

# Every test that passes on the published crates passes on the patched ones. rstest numbers a
# test's cases with as many digits as the last case needs, so a patch that adds cases renames
# the first ones (`case_1_single` becomes `case_01_single`): the numbers are compared unpadded.
unpad() { sed -E 's/::case_0+([1-9])/::case_\1/' | LC_ALL=C sort; }
missing=$(LC_ALL=C comm -23 <(grep -v '^#' "$stock_list" | unpad) \
  <(awk '$3 == "ok" { print $1, $2 }' "$work/patched.results" | unpad))
if [ -n "$missing" ]; then
  echo "upstream-tests: these pass on the published crates but not on the patched ones:" >&2
  echo "$missing" >&2
  status=1
fi
for c in $tested; do
  printf 'upstream-tests: %s: %d pass as published, %d patched (%d skipped by name)\n' "$c" \
    "$(grep -c "^$c " "$stock_list" || true)" \
    "$(awk -v c="$c" '$1 == c && $3 == "ok"' "$work/patched.results" | wc -l)" \
    "$(grep -c "^$c " <(sed -e 's/#.*//' "$dir/skip.txt") || true)"
done

# Each `unsafe` block the patches add is exercised by a test of patches/upstream-tests/miri.txt,
# run here under Miri, which fails on undefined behaviour (an uninitialized read, a use after
# free, a leak) where a native run may pass. Miri needs a nightly toolchain, pinned here so that
# what it accepts does not change under us; scripts/setup.sh installs it. Isolation is off so
# that the clock tests read the host's clocks. Building the crates and their dev-dependencies
# for Miri takes minutes, and its verdict depends only on the patched copies, patched.lock,
# miri.txt, the workspace manifest and the toolchain: the tests that pass are kept in
# patches/upstream-tests/miri-passes.txt under a key of those, and run again only when it no
# longer matches (a patch changed) or with --miri. (The native run above runs them always.)
miri_toolchain=nightly-2026-05-20
miri_list=$dir/miri-passes.txt
miri_key=$( {
  for c in $crates; do (cd "patches/$c" && find . -type f | LC_ALL=C sort | xargs sha256sum); done
  cat "$dir/patched.lock" "$dir/miri.txt" "$dir/Cargo.toml"
  echo "$miri_toolchain"
} | sha256sum | cut -c1-16)
if [ "$mode" != --miri ] && [ "$mode" != --write-locks ] &&
  [ "$(head -1 "$miri_list" 2>/dev/null)" = "# key $miri_key" ]; then
  echo "upstream-tests: miri: the patched crates and the list are as when $miri_list was" \
    "written: $(grep -vc '^#' "$miri_list") tests passed then, not run again (--miri runs them)" >&2
  exit "$status"
fi
if ! cargo "+$miri_toolchain" miri --version >/dev/null 2>&1; then
  echo "upstream-tests: the patches changed since $miri_list was written, and Miri must run" \
    "their unsafe blocks' tests again: install it with" \
    "rustup toolchain install $miri_toolchain --profile minimal --component miri --component rust-src" >&2
  exit 1
fi
miri_status=0
miri_passed=()
while read -r crate name _; do
  [ -n "$name" ] || continue
  log=$work/miri-$crate-${name##*::}.log
  if (cd "$work/patched" && MIRIFLAGS=-Zmiri-disable-isolation nice cargo "+$miri_toolchain" \
    miri test --locked --lib -p "$crate" -- --exact "$name") >"$log" 2>&1 &&
    grep -q '^test result: ok. 1 passed' "$log"; then
    echo "upstream-tests: miri: $crate $name: ok" >&2
    miri_passed+=("$crate $name")
  else
    tail -40 "$log" >&2
    echo "upstream-tests: miri: $crate $name failed (log: $log)" >&2
    miri_status=1
  fi
done < <(sed -e 's/#.*//' "$dir/miri.txt")
if [ "$miri_status" -eq 0 ]; then
  {
    echo "# key $miri_key"
    echo "# The tests of miri.txt that pass under Miri, from scripts/upstream-tests.sh; the key"
    echo "# hashes the patched copies, patched.lock, miri.txt, Cargo.toml and the toolchain."
    printf '%s\n' "${miri_passed[@]}"
  } >"$miri_list"
  echo "upstream-tests: wrote $miri_list" >&2
fi
[ "$miri_status" -eq 0 ] || status=1
exit "$status"
