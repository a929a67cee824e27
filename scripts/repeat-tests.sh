#!/bin/bash
# Run the test binaries that build clusters (lab, chaos, cluster) N times in
# a row, stopping at the first failure, to show that they are not flaky.
# Issue 20 asks for 20 passes; one pass takes about 5 minutes on a 2-core VM.
#
#   sudo scripts/repeat-tests.sh [N]      (default 20)
#
# Each test cleans up its own namespaces, bridges and cgroups; this script
# adds nothing to undo.
set -u
cd "$(dirname "$0")/.."
passes=${1:-20}
# The tests run the daemon and the preload library, which `cargo test -p
# memlend` does not build.
cargo build --release -q --workspace || exit 1
cargo test --release -q -p memlend --test lab --test chaos --test cluster --no-run || exit 1
# A test that skips (it logs "SKIPPED: ..." to MEMLEND_SKIP_LOG) passes as
# far as cargo can tell; a pass in which any test skipped, or none ran, is
# not green.
skiplog=$(mktemp)
trap 'rm -f "$skiplog"' EXIT
export MEMLEND_SKIP_LOG=$skiplog
for i in $(seq 1 "$passes"); do
  for t in lab chaos cluster; do
    start=$(date +%s)
    : >"$skiplog"
    out=$(cargo test --release -q -p memlend --test "$t" 2>&1)
    rc=$?
    result=$(echo "$out" | grep "test result" | tail -1)
    echo "pass $i/$passes $t: exit $rc in $(( $(date +%s) - start )) s; $result"
    if [ "$rc" -ne 0 ]; then
      echo "$out" | grep -E -A6 "FAILED|panicked" | head -60
      echo "repeat-tests: pass $i of $passes failed in $t"
      exit 1
    fi
    if [ -s "$skiplog" ]; then
      sed 's/^/  /' "$skiplog"
      echo "repeat-tests: pass $i of $passes skipped tests in $t (not green: run as root)"
      exit 1
    fi
    if ! echo "$result" | grep -qE "ok\. [1-9][0-9]* passed"; then
      echo "repeat-tests: pass $i of $passes ran no test in $t"
      exit 1
    fi
  done
done
echo "repeat-tests: all $passes passes green"
