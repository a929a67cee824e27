#!/usr/bin/env bash
# Sum cargo's per-binary "test result" lines into one closing line, and fail
# if any test failed or if no test ran at all. Tests that skipped (they log
# "SKIPPED: <test>: <why>" to SKIPLOG) count as skipped, not passed: cargo
# cannot tell them apart. "ignored" are #[ignore] tests (measurements, and
# helpers other tests run in a process of their own).
set -euo pipefail
log=${1:?usage: test-summary.sh LOG [SKIPLOG]}
skiplog=${2:-$(dirname "$log")/skipped.log}
read -r passed failed ignored < <(awk '/^test result:/ {
  for (i = 1; i <= NF; i++) {
    if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i
  } } END { print p+0, f+0, g+0 }' "$log")
skips=$(grep -s '^SKIPPED: ' "$skiplog" | sort -u || true)
skipped=$(grep -c . <<<"$skips" || true)
passed=$((passed - skipped))
echo "$passed passed, $failed failed, $skipped skipped ($ignored ignored)"
[ -z "$skips" ] || sed 's/^SKIPPED: /  skipped: /' <<<"$skips"
# Name the failures last, where a log cut to its tail still shows them, with
# each one's captured output (cargo prints it under "---- NAME stdout ----").
fails=$(grep -E '^test .* \.\.\. FAILED$' "$log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/' | sort -u || true)
if [ -n "$fails" ]; then
  echo "failed tests:"
  sed 's/^/  /' <<<"$fails"
  awk '/^---- .* stdout ----$/ { show = 1; n = 0 } /^failures:$/ && show { show = 0 }
       show && n++ < 40 { print "  | " $0 }' "$log"
fi
if [ "$failed" -ne 0 ] || [ "$passed" -le 0 ] || grep -q '^error' "$log"; then
  exit 1
fi
