#!/usr/bin/env bash
# The main job, for now: start a donor, use its memory through the native
# page protocol and through NBD with real clients, and print what happened.
# Everything it starts is stopped, and its files removed, on every exit path.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release
LEND=${MEMLEND_DEMO_LEND:-1G}
EXPORT=${MEMLEND_DEMO_EXPORT:-256M}

work=$(mktemp -d /tmp/memlend-demo.XXXXXX)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "demo: nothing listening on port $1" >&2; exit 1
}
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

page_port=$(free_port); nbd_port=$(free_port)
"$BIN/memlend" keygen "$work/cluster.key" >/dev/null
step "donor: memlendd lends $LEND (page protocol :$page_port, NBD export 'demo' of $EXPORT on :$nbd_port)"
"$BIN/memlendd" --lend "$LEND" --listen "127.0.0.1:$page_port" --nbd "127.0.0.1:$nbd_port" \
  --export "demo=$EXPORT" --key "$work/cluster.key" 2>"$work/memlendd.log" &
daemon=$!
wait_port "$page_port"; wait_port "$nbd_port"
K=(--donor "127.0.0.1:$page_port" --key "$work/cluster.key")

step "native protocol: authenticated with the cluster key"
"$BIN/memlend" status "${K[@]}"
verify_out=$("$BIN/memlend" verify "${K[@]}" --size 512M)
echo "$verify_out"
bench_out=$("$BIN/memlend" bench "${K[@]}" --op read --conns 4 --depth 32 --secs 2 --slab 64M)
echo "$bench_out"
echo "a wrong key is refused:"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/wrong.key"; echo >>"$work/wrong.key"; chmod 600 "$work/wrong.key"
if "$BIN/memlend" status --donor "127.0.0.1:$page_port" --key "$work/wrong.key" 2>&1; then
  echo "demo: a wrong key was accepted" >&2; exit 1
fi

step "far memory (first slice): a 512 MiB region with a 128 MiB local budget, pages on the donor"
far_out=$("$BIN/memlend" far "${K[@]}" --size 512M --local 128M)
echo "$far_out"

step "NBD: real clients against the export"
nbdinfo "nbd://127.0.0.1:$nbd_port/demo" | grep -E "export-size|block_size|can_multi_conn" | sed 's/^/  /'
head -c 128M /dev/urandom >"$work/in.img"
qemu-img convert -n -f raw -O raw "$work/in.img" "nbd://127.0.0.1:$nbd_port/demo"
nbdcopy "nbd://127.0.0.1:$nbd_port/demo" "$work/out.img"
in_sum=$(sha256sum <"$work/in.img" | cut -c1-16)
out_sum=$(head -c 128M "$work/out.img" | sha256sum | cut -c1-16)
echo "qemu-img convert 128 MiB in, nbdcopy out: sha256 $in_sum -> $out_sum"
[ "$in_sum" = "$out_sum" ] || { echo "demo: NBD round trip differs" >&2; exit 1; }
fio_out=$(fio --name=demo --ioengine=nbd --uri="nbd://127.0.0.1:$nbd_port/demo" --rw=randrw \
  --rwmixread=70 --bs=4k --iodepth=32 --size="$EXPORT" --time_based --runtime=3 \
  --output-format=json 2>/dev/null)
read -r r_iops w_iops < <(python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(int(j["read"]["iops"]), int(j["write"]["iops"]))' <<<"$fio_out")
echo "fio nbd engine, 4 KiB 70/30 random, QD32: $r_iops read + $w_iops write IOPS"

step "summary"
printf '  %-34s %s\n' "native: written and read back" "$(grep -o '[0-9.]* [KMG]iB to slab' <<<"$verify_out" | cut -d' ' -f1-2), $(grep -o '[0-9]* of [0-9]* pages differ' <<<"$verify_out")"
printf '  %-34s %s\n' "native: 4 conns x 32 in flight" "$(grep -o '[0-9]* pages/s.*' <<<"$bench_out")"
printf '  %-34s %s\n' "far memory: 4x its local budget" "$(grep -o '[0-9]* of [0-9]* pages differ' <<<"$far_out")"
printf '  %-34s %s\n' "NBD: qemu-img in, nbdcopy out" "byte-identical ($in_sum)"
printf '  %-34s %s\n' "NBD: fio 70/30 QD32" "$((r_iops + w_iops)) IOPS"
printf '  %-34s %s\n' "wrong key" "refused"
echo
echo "demo: ok. Next: unmodified programs in far memory (memlend run) and kernel swap beside it."
