#!/usr/bin/env bash
# Per-version totals of the real-plane test variants of the latest run of each test binary
# (the records e2e::realkube::summary writes to <target dir>/realkube-summary/*.tsv):
#   real control plane v1.19.2: 60 ran, 0 skipped
# With CI=true it fails when a version ran no test or a test was skipped.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-target}
case "$target" in /*) ;; *) target=$repo/$target ;; esac
dir=$target/realkube-summary
shopt -s nullglob
files=("$dir"/*.tsv)
if [ ${#files[@]} -eq 0 ]; then
  echo "real control plane: no real-plane test has run (no records in $dir)"
  [ "${CI:-}" = true ] && exit 1
  exit 0
fi
cat "${files[@]}" | awk -F'\t' -v ci="${CI:-}" '
  { seen[$1] = 1; n[$1, $2]++; if ($2 == "skipped" && !($1 in why)) why[$1] = $4 }
  END {
    bad = 0
    for (v in seen) {
      ran = n[v, "ran"] + 0; skipped = n[v, "skipped"] + 0
      line = sprintf("real control plane %s: %d ran, %d skipped", v, ran, skipped)
      if (skipped) line = line " (" why[v] ")"
      print line
      if (ran == 0 || skipped > 0) bad = 1
    }
    if (ci == "true" && bad) { print "CI=true: every real-plane test must run on every version"; exit 1 }
  }' | sort
