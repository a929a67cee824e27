#!/usr/bin/env bash
# The main job: start a donor; run one unmodified program whose memory is 4x
# its local budget under `memlend run` (pages on the donor, then on an SSD
# file) and under kernel swap to a local swapfile in a cgroup of the same
# budget; use the donor through the native protocol and through NBD with
# real clients; kill a donor under a mirrored region; print what happened.
# Everything it starts (daemons, swapfile, cgroup) is stopped or removed on
# every exit path.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release
LEND=${MEMLEND_DEMO_LEND:-2G}
WORK_SIZE=${MEMLEND_DEMO_WORK:-1G}     # the program's memory
LOCAL=${MEMLEND_DEMO_LOCAL:-256M}      # its local budget: a quarter
OPS=${MEMLEND_DEMO_OPS:-400000}        # zipf 0.99 touches, half of them writes
EXPORT=${MEMLEND_DEMO_EXPORT:-256M}

work=$(mktemp -d /tmp/memlend-demo.XXXXXX)
daemon=""
mirror_donors=()
swapfile=""
cgroup=""
cleanup() {
  [ -n "$daemon" ] && kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  for d in "${mirror_donors[@]}"; do { kill -KILL "$d"; wait "$d"; } 2>/dev/null || true; done
  [ -n "$swapfile" ] && { swapoff "$swapfile" 2>/dev/null || true; rm -f "$swapfile"; }
  [ -n "$cgroup" ] && { rmdir "$cgroup" 2>/dev/null || true; }
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

step "memlend run: one unmodified program, $WORK_SIZE of memory, $LOCAL local (4x over)"
cc -O2 -o "$work/touch" bench/touch.c -lm
T=("$work/touch" --size "$WORK_SIZE" --pattern zipf --ops "$OPS" --verify)
field() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1"; }
run_one() { # name, then the command; prints "name: touches/s checksum ok"
  local name=$1; shift
  local out; out=$("$@" 2>"$work/$name.err") || { cat "$work/$name.err" >&2; echo "demo: $name failed" >&2; exit 1; }
  printf '%s %s %s\n' "$(field touches_per_s <<<"$out" | cut -d. -f1)" "$(field checksum <<<"$out")" "$(field ok <<<"$out")"
}
read -r local_tps local_sum local_ok < <(run_one local "${T[@]}")
echo "  all local (no limit)           $local_tps touches/s  checksum $local_sum  verified $local_ok"
read -r donor_tps donor_sum donor_ok < <(run_one donor "$BIN/memlend" run --local "$LOCAL" "${K[@]}" -- "${T[@]}")
echo "  memlend run, pages on donor    $donor_tps touches/s  checksum $donor_sum  verified $donor_ok"
sed 's/^/    /' "$work/donor.err"
read -r ssd_tps ssd_sum ssd_ok < <(run_one ssd "$BIN/memlend" run --local "$LOCAL" --ssd /var/tmp -- "${T[@]}")
echo "  memlend run, pages on SSD file $ssd_tps touches/s  checksum $ssd_sum  verified $ssd_ok"
swap_tps=""
if [ -n "$(swapon --show --noheadings 2>/dev/null)" ] || [ ! -w /sys/fs/cgroup/memory ]; then
  echo "  kernel swap: skipped (this machine has swap on already, or no cgroup v1 memory controller)"
else
  swapfile=/var/tmp/memlend-demo-$$.swap
  fallocate -l 2G "$swapfile" && chmod 600 "$swapfile" && mkswap -q "$swapfile" >/dev/null && swapon "$swapfile"
  cgroup=/sys/fs/cgroup/memory/memlend-demo-$$
  mkdir "$cgroup" && echo "$LOCAL" >"$cgroup/memory.limit_in_bytes"
  read -r swap_tps swap_sum swap_ok < <(run_one swap sh -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$cgroup" "${T[@]}")
  echo "  kernel swap to a local file    $swap_tps touches/s  checksum $swap_sum  verified $swap_ok  (cgroup v1 limit $LOCAL)"
  swapoff "$swapfile"; rm -f "$swapfile"; swapfile=""; rmdir "$cgroup"; cgroup=""
fi
for sum in "$donor_sum" "$ssd_sum" ${swap_sum:+"$swap_sum"}; do
  [ "$sum" = "$local_sum" ] || { echo "demo: a far-memory run computed a different result" >&2; exit 1; }
done

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

step "a donor dies under a mirrored region: nothing lost"
mports=("$(free_port)" "$(free_port)" "$(free_port)")
for p in "${mports[@]}"; do
  "$BIN/memlendd" --lend 512M --listen "127.0.0.1:$p" --key "$work/cluster.key" 2>>"$work/mirror.log" &
  mirror_donors+=("$!")
done
for p in "${mports[@]}"; do wait_port "$p"; done
"$BIN/memlend" far --key "$work/cluster.key" --donor "127.0.0.1:${mports[0]}" \
  --also "127.0.0.1:${mports[1]}" --also "127.0.0.1:${mports[2]}" --redundancy mirror \
  --size 256M --local 32M --random-passes 0 --hold-s 6 >"$work/mirror.out" 2>>"$work/mirror.log" &
far_pid=$!
for _ in $(seq 600); do grep -q "held 2 s" "$work/mirror.out" && break; sleep 0.1; done
{ kill -KILL "${mirror_donors[1]}"; wait "${mirror_donors[1]}"; } 2>/dev/null || true
echo "  killed the donor on :${mports[1]} (kill -9) two seconds into the run"
if ! wait "$far_pid"; then cat "$work/mirror.out" "$work/mirror.log" >&2; echo "demo: the mirrored run failed" >&2; exit 1; fi
sed 's/^/  /' "$work/mirror.out" | grep -E "copies|pages differ|longest touch"
mirror_ok="$(grep -o '[0-9]* legs failed, [0-9]* rebuilt' "$work/mirror.out"), $(grep -o '[0-9]* pages lost' "$work/mirror.out"), $(grep -o 'longest touch while held: [0-9]* ms' "$work/mirror.out" | sed 's/longest touch while held: /pause /')"

step "a cluster that manages itself (ACMS Figure 6, in a 3-node lab)"
cluster_ok="skipped (needs root)"
if [ "$(id -u)" = 0 ]; then
  if /usr/bin/python3 bench/acms_fig6.py --prefix demo6 --subnet 10.76.0.0/24 --out "$work/acms" | tee "$work/acms.log" | sed 's/^/  /'; then
    cluster_ok="classes, reclaim, migration as expected, every page verified ($(grep -o 'p50 [0-9]* us' "$work/acms.log" | head -1) handshake)"
  else
    echo "demo: the cluster scenario failed" >&2
    exit 1
  fi
fi

step "summary"
printf '  %-34s %s\n' "native: written and read back" "$(grep -o '[0-9.]* [KMG]iB to slab' <<<"$verify_out" | cut -d' ' -f1-2), $(grep -o '[0-9]* of [0-9]* pages differ' <<<"$verify_out")"
printf '  %-34s %s\n' "native: 4 conns x 32 in flight" "$(grep -o '[0-9]* pages/s.*' <<<"$bench_out")"
ratio() { python3 -c "import sys; print(f'{int(sys.argv[1])/int(sys.argv[2]):.3g}x')" "$1" "$2"; }
printf '  %-34s %s\n' "memlend run, $WORK_SIZE on $LOCAL, donor" "$donor_tps touches/s ($(ratio "$donor_tps" "$local_tps") of all-local), same checksum"
printf '  %-34s %s\n' "memlend run, SSD file" "$ssd_tps touches/s ($(ratio "$ssd_tps" "$local_tps") of all-local), same checksum"
if [ -n "$swap_tps" ]; then
  printf '  %-34s %s\n' "kernel swap, local swapfile" "$swap_tps touches/s; memlend on the donor is $(ratio "$donor_tps" "$swap_tps") of it"
fi
printf '  %-34s %s\n' "NBD: qemu-img in, nbdcopy out" "byte-identical ($in_sum)"
printf '  %-34s %s\n' "NBD: fio 70/30 QD32" "$((r_iops + w_iops)) IOPS"
printf '  %-34s %s\n' "wrong key" "refused"
printf '  %-34s %s\n' "donor killed under a mirror" "$mirror_ok"
printf '  %-34s %s\n' "cluster: lend, reclaim, borrow" "$cluster_ok"
echo
echo "demo: ok."
