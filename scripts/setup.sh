#!/usr/bin/env bash
# Install what memlend needs to build, test, demo and benchmark, on Debian.
# Idempotent: packages already present are not reinstalled, and a second run
# does nothing but check.
set -euo pipefail

APT_PACKAGES=(
  build-essential pkg-config libclang-dev   # Rust crates with C parts (ring, aws-lc-sys: cc, no cmake)
  fio nbdkit libnbd-bin qemu-utils          # real NBD peers and clients
  openssl                                   # certificates for the NBD TLS tests
  python3 python3-matplotlib python3-numpy  # benchmark tables and plots
  iproute2 iptables procps psmisc           # lab networking (and loss injection), process tools
  redis-server redis-tools                  # an unmodified program under memlend run
  memcached                                 # another one (bench/apps.py)
  openjdk-17-jdk-headless nodejs            # a JVM and Node.js under memlend run (heaps reserved PROT_NONE)
  postgresql                                # its shared buffers under memlend run (pgbench, pg_amcheck)
  tmux                                      # memlend top tested in a real terminal
  dpkg-dev systemd                          # make deb, and its test (systemd-analyze verify)
  strace                                    # the unit's syscall filter against every call memlendd makes
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Rust: the stable toolchain from rustup (Debian's rustc is too old for the
# crates we use). rust-toolchain.toml pins the channel and components.
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found. Install Rust with rustup (https://rustup.rs), then run this again." >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
echo "setup: ok ($(cargo --version), $(fio --version), nbdkit $(nbdkit --version | awk '{print $2}'))"
