# memlend: two commands.
#   make demo   set up, build, and run the main job
#   make test   set up, and run the whole test suite
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: demo test setup build lint deb bench bench-nbd bench-proto fuzz clean

demo: setup build
	scripts/demo.sh

# --no-fail-fast: every failing test binary is reported, not just the first;
# the summary is printed whether or not cargo failed. The fault, store and
# wire tests then run again with debug assertions and overflow checks on
# (profile `checked`), so their debug_assert! invariants are exercised too.
CHECKED_CRATES := -p memlend-fault -p memlend-store -p memlend-wire
test: setup lint build
	@mkdir -p target && rm -f target/skipped.log
	set -o pipefail; export MEMLEND_SKIP_LOG=$(CURDIR)/target/skipped.log; \
	  cargo test --workspace --release --no-fail-fast 2>&1 | tee target/test.log; status=$$?; \
	  echo "== again with debug assertions: $(CHECKED_CRATES)" | tee -a target/test.log; \
	  cargo test --profile checked $(CHECKED_CRATES) --no-fail-fast 2>&1 | tee -a target/test.log || status=1; \
	  scripts/test-summary.sh target/test.log target/skipped.log && exit $$status
	scripts/fuzz_smoke.sh

setup:
	@scripts/setup.sh

build:
	cargo build --release --workspace

# The Debian package, into target/debian/ (docs/install.md).
deb: setup build
	scripts/deb.sh

# The structure check: no import circle among the rooms of any crate
# (scripts/structure.py), and its self-test first, so a check that could no
# longer find a circle fails too.
lint:
	python3 scripts/structure.py --self-test
	python3 scripts/structure.py
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --release -- -D warnings

bench: bench-proto bench-nbd

bench-proto: setup build
	/usr/bin/python3 bench/proto.py

bench-nbd: setup build
	/usr/bin/python3 bench/nbd_fio.py

# Each decoder target for FUZZ_RUNS executions (needs cargo-fuzz and nightly).
FUZZ_RUNS ?= 1000000
fuzz:
	cd fuzz && for t in page_request page_reply page_handshake ctrl_decode nbd_handshake nbd_command; do \
	  cargo +nightly fuzz run -O $$t corpus/$$t -- -runs=$(FUZZ_RUNS) -max_len=1500 || exit 1; done

clean:
	cargo clean
