#!/usr/bin/env bash
# A short fuzzing pass for CI: every target in fuzz/Cargo.toml, started from
# its committed corpus, for FUZZ_SMOKE_RUNS executions or FUZZ_SMOKE_SECONDS
# seconds, whichever comes first. Fails if any target crashes (the input that
# did it is left in fuzz/artifacts/<target>/). The committed corpus is only
# read: new inputs go to a temporary directory, removed on exit.
#
# Installs cargo-fuzz and the nightly toolchain when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

RUNS="${FUZZ_SMOKE_RUNS:-200000}"
SECONDS_PER_TARGET="${FUZZ_SMOKE_SECONDS:-20}"
MAX_LEN=1500

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz_smoke: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
if ! rustup toolchain list 2>/dev/null | grep '^nightly' >/dev/null; then
    echo "fuzz_smoke: installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/fuzz_smoke.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

cd fuzz
mapfile -t targets < <(cargo +nightly fuzz list)
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz_smoke: no targets in fuzz/Cargo.toml" >&2
    exit 1
fi

build_start=$(date +%s)
cargo +nightly fuzz build -O >"$tmp/build.log" 2>&1 || {
    cat "$tmp/build.log" >&2
    echo "fuzz_smoke: build failed" >&2
    exit 1
}
echo "fuzz_smoke: built ${#targets[@]} targets in $(($(date +%s) - build_start)) s"

failed=()
for t in "${targets[@]}"; do
    mkdir -p "$tmp/$t"
    log="$tmp/$t.log"
    start=$(date +%s%N)
    status=0
    # New inputs land in the first corpus directory (the temporary one).
    cargo +nightly fuzz run -O "$t" "$tmp/$t" "corpus/$t" -- \
        -runs="$RUNS" -max_total_time="$SECONDS_PER_TARGET" -max_len="$MAX_LEN" \
        -print_final_stats=1 >"$log" 2>&1 || status=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    secs="$((ms / 1000)).$((ms % 1000 / 100))"
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    if [ "$status" -ne 0 ]; then
        failed+=("$t")
        printf '%-16s FAILED (exit %d) after %s executions, %s s\n' \
            "$t" "$status" "${execs:-?}" "$secs"
        grep -E 'panicked|ERROR: |SUMMARY|Test unit written' "$log" | head -20 >&2 || true
    else
        printf '%-16s ok: %s executions, %s s, cov %s\n' "$t" "${execs:-?}" "$secs" "${cov:-?}"
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz_smoke: crashed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz_smoke: all ${#targets[@]} targets passed"
