#!/bin/sh
# Checks that nothing of the old notebook was lost: the files listed in loadtest/log/README.md,
# taken in their "old #" order with their `#` heading made `##` again, must equal byte for byte
# the sections of loadtest/RESULTS.md as it was before the split (commit 04befd9, or the one
# given as $1), and the old page's opening note must be quoted in the README.
set -eu
cd "$(dirname "$0")/../.."
base=${1:-04befd9}
old=$(mktemp) new=$(mktemp)
trap 'rm -f "$old" "$new"' EXIT
git show "$base:loadtest/RESULTS.md" | sed -n '/^## /,$p' >"$old"
files=$(grep -E '^\| [^|]+ \| [0-9]+ \| \[' loadtest/log/README.md | sort -t'|' -k3,3n |
    awk -F'|' '{print $4}' | sed -E 's/.*\]\(([^)]+)\).*/\1/')
for f in $files; do
    printf '#'
    cat "loadtest/log/$f"
done >"$new"
listed=$(echo "$files" | wc -l)
present=$(ls loadtest/log/ | grep -cvE '^(README\.md|check\.sh)$')
[ "$listed" -eq "$present" ] || { echo "README lists $listed files, loadtest/log/ has $present" >&2; exit 1; }
cmp "$old" "$new" || { echo "log files differ from $base's sections" >&2; exit 1; }
git show "$base:loadtest/RESULTS.md" | sed -n '3,/^## /p' | sed '$d' | sed '/^$/d' | sed 's/^/> /' >"$new"
grep -Fxf "$new" loadtest/log/README.md | cmp -s - "$new" ||
    { echo "README does not quote the old opening note" >&2; exit 1; }
echo "ok: $listed log files equal the $(grep -c '^## ' "$old") sections of $base:loadtest/RESULTS.md ($(wc -c <"$old") bytes)"
