#!/usr/bin/env bash
# Sum cargo's per-binary "test result" lines into one closing line, and fail
# if any test failed or if no test ran at all.
set -euo pipefail
log=${1:?usage: test-summary.sh LOG}
read -r passed failed ignored < <(awk '/^test result:/ {
  for (i = 1; i <= NF; i++) {
    if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i
  } } END { print p+0, f+0, g+0 }' "$log")
echo "$passed passed, $failed failed, $ignored skipped"
if [ "$failed" -ne 0 ] || [ "$passed" -eq 0 ] || grep -q '^error' "$log"; then
  exit 1
fi
