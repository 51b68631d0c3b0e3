#!/usr/bin/env bash
# Every patched crate under patches/ must be its published release with its diff applied,
# nothing more: for each patches/<crate>-<version>.diff, take <crate> <version> as published
# (cargo fetches it into its registry), apply the diff with `patch -p1`, and compare every file
# of the copy in patches/<crate>/ with the result. A copy holds only what a build uses, so a
# release file the copy leaves out is fine; a file of the copy that differs, or that the
# release plus diff does not have, fails the check.
#
# --write CRATE...: after changing a patched crate, regenerate its diff from its copy instead
# (`diff -u` of the release against the copy, for every file the copy holds).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
write=" ${*:2} "
top=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The published sources, fetched by cargo (from its cache when present) through a throwaway
# package that depends on each release exactly.
mkdir -p "$work/fetch"
{
  printf '[package]\nname = "fetch-published"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n[lib]\npath = "lib.rs"\n[dependencies]\n'
  for d in patches/*.diff; do
    base=${d#patches/}
    base=${base%.diff}
    printf '%s = "=%s"\n' "${base%-*}" "${base##*-}"
  done
  printf '[workspace]\n'
} >"$work/fetch/Cargo.toml"
touch "$work/fetch/lib.rs"
(cd "$work/fetch" && cargo fetch --quiet)
registry=$(cargo metadata --quiet --format-version 1 --manifest-path "$work/fetch/Cargo.toml" |
  python3 -c 'import json, sys
for p in json.load(sys.stdin)["packages"]:
    print(p["name"], p["version"], p["manifest_path"].rsplit("/", 1)[0])')

failed=0
for d in patches/*.diff; do
  base=${d#patches/}
  base=${base%.diff}
  crate=${base%-*}
  version=${base##*-}
  src=$(awk -v n="$crate" -v v="$version" '$1 == n && $2 == v { print $3 }' <<<"$registry")
  [ -n "$src" ] || { echo "verify-patches: $crate $version not found by cargo" >&2; exit 1; }
  copy=patches/$crate
  files=$(cd "$copy" && find . -type f | sed 's|^\./||' | LC_ALL=C sort)
  if [ "$mode" = --write ]; then
    [[ "$write" == *" $crate "* ]] || continue
    : >"$d"
    while read -r f; do
      # diff exits 1 when the files differ; a release without the file reads as empty.
      old=$src/$f
      [ -f "$old" ] || old=/dev/null
      diff -u -p --label "a/$f" --label "b/$f" "$old" "$copy/$f" >>"$d" || [ $? -eq 1 ]
    done <<<"$files"
    echo "verify-patches: wrote $d"
    continue
  fi
  out=$work/$crate
  cp -a "$src/." "$out/"
  if ! (cd "$out" && patch --quiet --batch -p1 <"$top/$d" >"$work/$crate.patch.log" 2>&1); then
    echo "verify-patches: $d does not apply to $crate $version as published:" >&2
    cat "$work/$crate.patch.log" >&2
    failed=1
    continue
  fi
  while read -r f; do
    if ! cmp -s "$out/$f" "$copy/$f"; then
      echo "verify-patches: $copy/$f differs from $crate $version + $d:" >&2
      diff -u "$out/$f" "$copy/$f" | head -20 >&2 || true
      failed=1
    fi
  done <<<"$files"
  echo "verify-patches: $crate $version + $d: $(wc -l <<<"$files") files checked"
done
exit "$failed"
