#!/usr/bin/python3
"""Application benchmark with skewed keys: redis-server and memcached, unmodified, under a
YCSB-style zipfian load (bench/ycsb_load.c), where every peer gets the SAME total memory in
the SAME memory cgroup.

    sudo /usr/bin/python3 bench/apps.py                  # 768 MiB, fractions 25,50,75, 3 mixes
    sudo /usr/bin/python3 bench/apps.py --quick          # 512 MiB, 25%, read-only and 95/5, 20 s
         [--apps redis,memcached] [--size 768M] [--fractions 25,50,75]
         [--mixes read-only=100,95/5=95,50/50=50] [--peers local,swap-disk,zswap,zram,memlend-donor]
         [--seconds 30] [--warm-seconds S] [--threads 16] [--pipeline 1] [--values text|ycsb]
         [--value-size 1024] [--zipf 0.99] [--zram-share 0.5] [--zram-ratio 2]
         [--memlend-overhead MIB]
         [--memlend-args "..."] [--memlend-variant NAME=ARGS ...] [--name apps]

The dataset: --size (768 MiB) of resident server memory. Records of --value-size bytes (keys
"user%012d") are counted from the bytes per record measured at the start on a small all-local
instance of each app (memcg usage after loading 50 K records, over the empty server's), so
both apps hold about --size when loaded. Values are --values text by default: JSON-ish records
of phrases from a fixed vocabulary, which lz4 shrinks ~2.2x page by page (zram measured it),
because the compressed peers are meaningless on incompressible data; --values ycsb gives
YCSB's printable random bytes (lz4 ~1.0x).

The load (ycsb_load.c, a C client with --threads blocking connections, --pipeline requests
in flight each, closed loop): keys from YCSB's ScrambledZipfianGenerator (theta --zipf,
ranks over YCSB's 10^10 items, FNV-hashed onto the records: the hot records are scattered
over memory, and about 56% of draws come from the head at 650 K records); a read-pct mix of
GETs and updates (a SET of a fresh value of the same size). Every GET checks the key was
found and the value is the right length and carries its own key and body hash.

Each run, for each peer: start the server; load every record (untimed, pipelined SETs;
inside the limit for the limited peers); warm up (untimed: 2x records ops or --warm-seconds,
whichever ends first; a peer that the memcg OOM killer ends during a full-speed load is
run once more with a gentle load, 1 connection x 8 SETs in flight, and its row says so); the
timed phase (--seconds); then verify: DBSIZE (redis) / curr_items
(memcached) equals the record count, 200 random keys read back whole and right, no miss in
any phase, no memcg OOM kill; stop the server (redis: SHUTDOWN NOSAVE; memcached: SIGTERM)
so that memlend prints its summary.

LIMIT = fraction (--fractions, % of the all-local server's memcg peak usage, measured in the
first all-local run of each app) is the memory every limited peer gets, and it is always
the limit of one cgroup v1 memory cgroup (/sys/fs/cgroup/memory/apps_PID) that holds the
whole server process tree:

  local          the same memcg with no limit: the reference (and what LIMIT is a share of).
                 Also checks the client: 1x, 2x, 1x the threads, --client-check s each; "2x
                 thr" is the 2x run's ops/s over the mean of the two 1x runs (near or under
                 1: the server, not the client, is the limit).
  swap-disk      memory.limit_in_bytes = LIMIT; swap to a swapfile on /var/tmp (the local
                 disk), zswap off (far_micro's Machine makes and removes it).
  zswap          the same memcg, LIMIT and swapfile, zswap on with the compressor zram
                 gets too (lz4 if the kernel's crypto API has it, else lzo: the run says which). On cgroup v1 this kernel
                 does not charge zswap's pool to the memcg (measured: the memcg's kmem peak
                 stayed under 1 MiB while the pool held 50 MiB; the kernel charges it on v2
                 only), so zswap gets LIMIT plus its pool: the "total" column adds the pool's
                 peak (/proc/meminfo Zswap) to the memcg's peak, so the extra is visible, and
                 each row says whether it found the pool charged (zswap_pool_charged).
  zram           the same memcg, swap on /dev/zram0 (zswap's compressor). zram's pool is not charged to
                 the memcg either, so the same total LIMIT is split: memcg limit = LIMIT -
                 share, zram mem_limit = share (--zram-share, default LIMIT/2); "total" is
                 the memcg's peak plus zram's mem_used_max. zram's disksize is share x
                 --zram-ratio (2.0: text pages shrink ~2.2x, and zsmalloc adds a little),
                 with the disk swapfile active at a lower priority, as zram is deployed where
                 the data outgrows it: once zram's slots are full the kernel swaps to disk.
                 (With --zram-ratio 0, zram alone with a disksize of the whole dataset: once
                 it reaches its mem_limit every swap-out to it fails and the kernel keeps
                 retrying them, no OOM kill, the server just stalls.) Either way, after 2 M
                 failed swap-outs the run kills the server and its row says so.
                 zswap and zram run with vm.page-cluster 0 (--page-cluster-compressed), as
                 zram setups do: with this machine's default 3, zswap was memcg-OOM-killed at
                 50% (redis, 256 MiB; swap readahead decompresses 8 pages a fault into the
                 memcg), and ran at 0.68x all-local with 0. swap-disk keeps it as found
                 (--page-cluster-disk). Restored after each run.
  memlend-donor  `memlend run --local L --far F --donor 127.0.0.1:PORT --insecure -- SERVER`
                 (or `--mem LIMIT` if `memlend run --help` lists it: "the whole process stays
                 within LIMIT"), with a loopback donor memlendd (not in the memcg: it is the
                 far memory), the whole memlend run process tree in the memcg with limit
                 LIMIT. L = LIMIT - overhead: overhead is what the server and memlend hold
                 outside the far region's budget, measured at the start (memcg usage of the
                 empty server under memlend) plus a margin of 16 MiB + size/64 (page tables,
                 per-page metadata, which grow with the data); --memlend-overhead MIB sets it.
  memlend-zswap-total
                 memlend-donor with LIMIT = the total memory the zswap peer of the same cell
                 peaked at (its memcg's usage plus its compressed pool, which cgroup v1 does
                 not charge to the memcg): the two at equal total memory. Runs after zswap in
                 each cell; skipped where zswap did not run or failed.
  NAME           for each --memlend-variant NAME=ARGS: memlend-donor with ARGS appended
                 (after --memlend-args, which every memlend peer gets), e.g.
                 --memlend-variant memlend-lz4="--compress lz4".

--split-cpus: the borrower as one machine and the donor as another. Every peer's server and
client (and memlend's own threads) run on CPU 0 only; memlend's donor runs on CPU 1 only, as it
would on another machine. Without it the donor shares both cores with the server, the client
and memlend's handler, and its CPU (its spin most of all) is the borrower's; with it, each
peer's row is what the borrower's one core gives. The kernel's own threads (kswapd, the disk's
interrupts) stay free to use CPU 1, which favours the kernel peers if anything. All-local runs
on CPU 0 too, so "x local" compares like with like.

Peers run in a rotating order from cell to cell (a cell: app x mix x fraction), after the
all-local run of each app x mix, so that drift on this shared 2-core machine favours none;
before each run the CPUs get up to --wait-quiet s to become 80% idle. A peer that the memcg
OOM killer ends gets a row that says so. Per run it records ops/s, latency p50/p99/p99.9
(per operation), ratios to all-local (same app and mix, same run) and to swap-disk and zswap
of the same cell, the memcg's max_usage, the total memory (above), swap-ins/outs (vmstat
pswpin/pswpout and zswpin/zswpout over the timed phase, and over the whole run), "in/op":
pages brought back per timed operation from wherever each peer keeps them (swap-ins, zswap
loads, memlend's store and pool faults, from `memlend top`'s live files), the memlend
donor's peak resident set ("donor MiB", VmHWM: what its slabs, which grow with use, took) and CPU
time per timed operation ("donor cpu us/op": the donor shares these 2 cores here), the CPU
pressure during the timed phase (PSI "some": the share of time some task waited for a CPU;
the client, the server, memlend's threads and the donor share 2 cores), the client's CPU,
memory.failcnt (how often a charge hit the limit and had to reclaim), memlend's summary
lines, and the programs running beside it that it did not start ("not ours, running too":
on this shared 2-core machine another engineer's tests disturb every number). Prints the
table; writes bench/results/NAME.json (every field) and NAME.png
(ops/s over all-local against the local fraction, a line per peer, a panel per app x mix).

Floors, measured once before the runs (shared/tools/floors, as far_micro.py): one
userfaultfd COPY fault plus one TCP loopback round trip with a 4 KiB reply, on one core and
across cores. "fault p50 us" is memlend's store-fault p50 from its summary (the handler's
message read to the faulter's wake: a miss, never a hit), "x floor" its ratio to the
same-core floor; the issue's goal is at most 1.25x. The floor's COPY fault is timed by the
faulting thread, so it also holds the kernel's delivery of the fault and the thread's
return, which the handler's clock does not: this ratio reads low, and far_micro.py's
(a touch's p50, timed by the program) is the like-for-like one.

The machine is left as found on every exit path (normal, error, Ctrl-C, SIGTERM, SIGHUP),
through far_micro's Undo stack: servers, clients and donors killed, swapoff, swapfile
removed, zram reset, zswap (enabled, compressor) restored, the cgroup removed. Swap peers
are skipped, with a message, if swap is already active when it starts. Needs root, and
memcached (apt-get install memcached; scripts/setup.sh installs it).
"""

import argparse
import atexit
import contextlib
import glob
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from app_redis import Proc, RedisError, Resp, memlend_summary, other_benchmarks, snapshot_memlend  # noqa: E402
from far_micro import (CG_ROOT, MIB, UNDO, ZRAM, ZSWAP, Machine, active_swaps, human, log,  # noqa: E402
                       kernel_compressor, on_signal, parse_size, read, sh, vmstat, write)
from report import Column, report  # noqa: E402
from stall_trace import StallTrace  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
APPS = ["redis", "memcached"]
BASE_PEERS = ["local", "swap-disk", "zswap", "zram", "memlend-donor", "memlend-zswap-total"]
# Runs after zswap in its cell, with --mem (and its memcg limit) = zswap's total peak there.
AT_ZSWAP_TOTAL = "memlend-zswap-total"
SWAP_PEERS = ("swap-disk", "zswap", "zram")
ZSWAP_DIR = os.path.dirname(ZSWAP)
CAL_RECORDS = 50_000
CHECK_KEYS = 200


# ---- small helpers -------------------------------------------------------------------------------


def cg_read(machine, name):
    try:
        return int(read(f"{machine.cg}/{name}"))
    except (OSError, ValueError):
        return None


def meminfo_kib(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def zram_mm_stat():
    """orig_data_size, compr_data_size, mem_used_total, mem_limit, mem_used_max (bytes)."""
    try:
        v = [int(x) for x in read(f"{ZRAM}/mm_stat").split()]
        return {"orig": v[0], "compr": v[1], "used": v[2], "limit": v[3], "used_max": v[4]}
    except (OSError, ValueError, IndexError):
        return None


def zram_failed_writes():
    try:
        return int(read(f"{ZRAM}/io_stat").split()[1])
    except (OSError, ValueError, IndexError):
        return 0


class Sampler:
    """Peaks, every 0.2 s, of what no counter keeps a peak of: zswap's pool (/proc/meminfo
    Zswap, stored pages in Zswapped). With zram, also a watchdog: once zram is at its
    mem_limit every swap-out to it fails, and the kernel goes on retrying them (seen: 37 M
    failed swap-outs in 2 minutes while the load crawled at 1.3 K SETs/s, then stopped, and the
    server never answered again; no OOM kill). After ZRAM_STALL failed writes the server is
    killed (on_stall) and the row says so."""

    ZRAM_STALL = 2_000_000

    def __init__(self, on_stall=None):
        self.peak = {"zswap_pool_kib": 0, "zswapped_kib": 0}
        self.stalled = None
        self.on_stall = on_stall
        self.fw0 = zram_failed_writes() if on_stall else 0
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self.loop, daemon=True)
        self.th.start()

    def loop(self):
        while True:
            for k, key in (("zswap_pool_kib", "Zswap"), ("zswapped_kib", "Zswapped")):
                v = meminfo_kib(key)
                if v is not None:
                    self.peak[k] = max(self.peak[k], v)
            if self.on_stall and self.stalled is None:
                fw = zram_failed_writes() - self.fw0
                if fw > self.ZRAM_STALL:
                    self.stalled = fw
                    self.on_stall()
            if self.stop_ev.wait(0.2):
                return

    def stop(self):
        self.stop_ev.set()
        self.th.join()
        return self.peak


def proc_cpu_s(pid):
    """CPU seconds (user + system) a process has used so far, every thread's; None without it."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # utime and stime are fields 14 and 15 of stat(5); fields[0] here is field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def donor_peak_mib(pid):
    """The donor's peak resident set (VmHWM), in MiB: the memory its slabs really took
    (they grow with use), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def run_json(argv, timeout_s):
    """Run a ycsb_load invocation; its JSON line (with "exit"), or {"error": ...}."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def kill():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()

    tok = UNDO.push(f"kill ycsb_load {p.pid}", kill)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill()
        out, err = p.communicate()
        return {"error": f"ycsb_load did not finish in {timeout_s:.0f} s", "stderr": err[-500:]}
    finally:
        kill()
        UNDO.done(tok)
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            d = json.loads(line)
            d["exit"] = p.returncode
            return d
    return {"error": f"ycsb_load printed no result (exit {p.returncode}): {err.strip()[-300:]}"}


# ---- the two servers ---------------------------------------------------------------------------


class Redis:
    name = "redis"
    proto = "redis"

    def argv(self, port, workdir, a):
        return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", workdir]

    def ready(self, port, proc, timeout_s=60):
        deadline = time.time() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited ({proc.returncode}) before listening")
            try:
                r = Resp(port, timeout_s=120)
                r.cmd("PING")
                r.close()
                return
            except (OSError, RedisError):
                if time.time() > deadline:
                    raise RuntimeError(f"redis-server does not answer on {port} after {timeout_s} s")
                time.sleep(0.05)

    def count(self, port):
        r = Resp(port, timeout_s=120)
        try:
            return {"items": r.cmd("DBSIZE"), "used_memory_mib": round(int(r.info("memory")["used_memory"]) / MIB, 1)}
        finally:
            r.close()

    def stop(self, port, proc):
        try:
            r = Resp(port, timeout_s=30)
            try:
                r.cmd("SHUTDOWN", "NOSAVE")
            except (RedisError, OSError):
                pass  # redis exits without answering
            r.close()
        except OSError:
            pass


class Memcached:
    name = "memcached"
    proto = "memcached"

    def argv(self, port, workdir, a):
        mem = max(1024, 2 * a.size // MIB + 256)  # its own limit far above the dataset: no eviction
        return ["memcached", "-u", "root", "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", str(mem),
                "-t", str(a.memcached_threads), "-c", "4096"] + shlex.split(a.memcached_args)

    def stats(self, port):
        with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
            s.sendall(b"stats\r\n")
            buf = b""
            while not buf.endswith(b"END\r\n"):
                chunk = s.recv(65536)
                if not chunk:
                    raise OSError("memcached closed the connection")
                buf += chunk
        out = {}
        for line in buf.decode().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "STAT":
                out[parts[1]] = parts[2]
        return out

    def ready(self, port, proc, timeout_s=60):
        deadline = time.time() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"memcached exited ({proc.returncode}) before listening")
            try:
                self.stats(port)
                return
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError(f"memcached does not answer on {port} after {timeout_s} s")
                time.sleep(0.05)

    def count(self, port):
        st = self.stats(port)
        return {"items": int(st["curr_items"]), "evictions": int(st.get("evictions", 0)),
                "mc_bytes_mib": round(int(st.get("bytes", 0)) / MIB, 1)}

    def stop(self, port, proc):
        try:
            os.killpg(proc.proc.pid, signal.SIGTERM)  # memlend run passes it on
        except ProcessLookupError:
            pass


SERVERS = {"redis": Redis(), "memcached": Memcached()}


# ---- the benchmark ---------------------------------------------------------------------------------


class BgSave(threading.Thread):
    """redis: BGSAVE once, at the start of a timed phase, and time it to its end (the forked child
    writes the dataset as it was at the fork while the load goes on)."""

    def __init__(self, port, timeout_s):
        super().__init__(daemon=True)
        self.port, self.timeout_s, self.out = port, timeout_s, {}

    def run(self):
        try:
            r = Resp(self.port, timeout_s=60)
            t0 = time.time()
            r.cmd("BGSAVE")
            while time.time() - t0 < self.timeout_s:
                info = r.info("persistence")
                if info.get("rdb_bgsave_in_progress") == "0":
                    # fork() as redis timed it: for memlend, with the shim's pause in it
                    fork_us = r.info("stats").get("latest_fork_usec")
                    self.out = {"bgsave_s": round(time.time() - t0, 2),
                                "fork_ms": round(int(fork_us) / 1000, 1) if fork_us else None,
                                "bgsave_ok": info.get("rdb_last_bgsave_status") == "ok",
                                "bgsave_cow_mib": round(int(info.get("rdb_last_cow_size", 0)) / MIB, 1)}
                    break
                time.sleep(0.05)
            else:
                self.out = {"bgsave_ok": False, "bgsave_error": f"still saving after {self.timeout_s:.0f} s"}
            r.close()
        except (OSError, RedisError) as e:
            self.out = {"bgsave_ok": False, "bgsave_error": f"{type(e).__name__}: {e}"}


class Skip(Exception):
    """A peer that cannot run here; its row says why."""


class Bench:
    def __init__(self, a, machine, workdir, ycsb, binp, skips, variants, has_mem):
        self.a, self.machine, self.workdir, self.ycsb = a, machine, workdir, ycsb
        self.bin, self.skips, self.variants, self.has_mem = binp, skips, variants, has_mem
        self.zswap_compressor = None

    def ycsb_args(self, app, port, records, extra):
        a = self.a
        return [self.ycsb, "--proto", app.proto, "--port", str(port), "--records", str(records),
                "--value-size", str(a.value_size), "--values", a.values, "--zipf", str(a.zipf),
                "--seed", str(a.seed)] + extra

    # one server for the whole of a (calibration or overhead) measurement, no limit
    def _plain(self, app, argv, port, tag):
        m = self.machine
        m.set_limit(-1)
        self._empty_cg()
        server = Proc(argv, os.path.join(self.workdir, f"{tag}.log"), m.cg)
        app.ready(port, server)
        return server

    def _empty_cg(self):
        try:
            write(f"{self.machine.cg}/memory.force_empty", 0)  # page cache charged by earlier runs
        except OSError:
            pass

    def calibrate(self, app):
        """memcg bytes per record and the empty server's usage, on a small all-local server."""
        port = common.free_port()
        server = self._plain(app, app.argv(port, self.workdir, self.a), port, f"calibrate_{app.name}")
        try:
            time.sleep(0.3)
            u0 = cg_read(self.machine, "memory.usage_in_bytes")
            res = run_json(self.ycsb_args(app, port, CAL_RECORDS, ["--load", "--threads", "4"]), 300)
            if res.get("errors") or "error" in res:
                raise RuntimeError(f"calibration load failed: {res}")
            time.sleep(0.3)
            u1 = cg_read(self.machine, "memory.usage_in_bytes")
        finally:
            app.stop(port, server)
            server.wait(30)
            server.kill(signal.SIGKILL)
        return (u1 - u0) / CAL_RECORDS, u0

    def memlend_overhead(self, app):
        """memcg usage of the empty server under memlend run (donor on loopback), no limit."""
        dport, port = common.free_port(), common.free_port()
        donor = Proc([self.bin["memlendd"], "--lend", human(self.far() + 256 * MIB), "--listen",
                      f"127.0.0.1:{dport}", "--insecure"], os.path.join(self.workdir, f"memlendd_oh_{app.name}.log"))
        server = None
        try:
            common.wait_port(dport)
            # the empty server with a --local as small as a run's (even where --mem exists: --mem
            # sizes the far budget from what the process holds, so it says nothing about this)
            argv = self.memlend_argv(dport, self.a.memlend_args, None, app.argv(port, self.workdir, self.a),
                                     64 * MIB)
            server = self._plain(app, argv, port, f"overhead_{app.name}")
            # a few records in and out, so that the far region is opened, as in a real run
            res = run_json(self.ycsb_args(app, port, 2000, ["--load", "--threads", "2"]), 120)
            if res.get("errors") or "error" in res:
                raise RuntimeError(f"load under memlend failed: {res}")
            time.sleep(1.0)
            usage = cg_read(self.machine, "memory.usage_in_bytes")
            peak = cg_read(self.machine, "memory.max_usage_in_bytes")
        finally:
            if server is not None:
                app.stop(port, server)
                server.wait(60)
                server.kill(signal.SIGKILL)
            donor.kill(signal.SIGTERM)
        return usage, peak

    def far(self):
        """memlend's --far: the region's (virtual) size, room for the dataset twice over, unless the
        memlend arguments name one (a runtime reserves more than its data: bench/jobs.py's jvm, go);
        the donor lends this and 256 MiB."""
        extra = shlex.split(self.a.memlend_args or "")
        if "--far" in extra[:-1]:
            return parse_size(extra[extra.index("--far") + 1])
        return max(1 << 30, 2 * self.a.size + 256 * MIB)

    def memlend_argv(self, dport, args, limit, server_argv, local=None):
        """memlend run ... -- server_argv: `--mem limit` where it exists and limit is given,
        else `--local local`."""
        budget = ["--mem", f"{limit // MIB}M"] if self.has_mem and limit else ["--local", f"{local // MIB}M"]
        extra = shlex.split(args or "")
        # A variant with --ssd DIR keeps its far pages in a file there, not on the donor.
        store = [] if "--ssd" in extra else ["--donor", f"127.0.0.1:{dport}", "--insecure"]
        # A job that names its own --far (a JVM reserves more than its data) keeps it.
        far = [] if "--far" in extra else ["--far", human(self.far())]
        return ([self.bin["memlend"], "run"] + budget + far + ["--preload", self.bin["libmemlend_preload.so"]]
                + store + extra + ["--"] + server_argv)

    def donor_prefix(self):
        """Under --split-cpus the donor runs on CPU 1 alone, as on another machine."""
        return ["taskset", "-c", "1"] if self.a.split_cpus else []

    def donor_args(self, peer):
        """Extra memlendd arguments for this peer (--donor-variant PEER=ARGS)."""
        for v in getattr(self.a, "donor_variant", None) or []:
            name, _, args = v.partition("=")
            if name == peer:
                return shlex.split(args)
        return []

    def memlend_peer_args(self, peer):
        base = self.a.memlend_args or ""
        return (base + " " + self.variants[peer]).strip() if peer in self.variants else base

    def zswap_on(self):
        """zswap on with the compressor zram gets too (far_micro.kernel_compressor); the undo token."""
        comp0 = read(f"{ZSWAP_DIR}/compressor")
        tok = UNDO.push("zswap off", lambda: (write(ZSWAP, "N"), write(f"{ZSWAP_DIR}/compressor", comp0)))
        try:
            write(f"{ZSWAP_DIR}/compressor", kernel_compressor())
        except OSError:
            pass  # refused: its default stays, and the run says which
        self.zswap_compressor = read(f"{ZSWAP_DIR}/compressor")
        write(ZSWAP, "Y")
        return tok, comp0

    def zswap_off(self, tok, comp0):
        write(ZSWAP, "N")
        try:
            write(f"{ZSWAP_DIR}/compressor", comp0)
        except OSError:
            pass
        UNDO.done(tok)

    @contextlib.contextmanager
    def peer_env(self, peer, limit, tag, row, oh=None):
        """The memory `peer` runs in, made on entry and undone on every exit: swap to disk, zswap
        or zram (with vm.page-cluster), or a loopback donor for a memlend peer; nothing for local.
        Yields (memcg limit or -1, wrap), where wrap(argv) is the command that runs argv under the
        peer. Records what it set up in row. Raises Skip where the peer cannot run."""
        a, m = self.a, self.machine
        swap_tok = disk_tok = zswap = donor = pc_tok = None
        cg_limit = -1
        wrap = list
        try:
            swap_size = a.size + a.size // 4
            pc = a.page_cluster_compressed if peer in ("zswap", "zram") else a.page_cluster_disk
            if peer in SWAP_PEERS:
                if pc != "asis" and pc != m.page_cluster:
                    pc_tok = UNDO.push("restore vm.page-cluster",
                                       lambda: write("/proc/sys/vm/page-cluster", m.page_cluster))
                    write("/proc/sys/vm/page-cluster", pc)
                row["page_cluster"] = int(read("/proc/sys/vm/page-cluster"))
            if peer in ("swap-disk", "zswap"):
                swap_tok = m.swap_on("swap-disk", swap_size)
                cg_limit = limit
                if peer == "zswap":
                    zswap = self.zswap_on()
                    row["zswap_compressor"] = self.zswap_compressor
            elif peer == "zram":
                share = int(limit * a.zram_share) if a.zram_share < 1 else int(a.zram_share)
                share = share // MIB * MIB
                if a.zram_ratio > 0:
                    # zram then disk swap, as deployed where the data outgrows zram: zram's slots
                    # hold about what its share holds compressed, and the kernel swaps to disk
                    # (lower priority) once they are full, rather than failing every swap-out
                    disksize = int(share * a.zram_ratio) // MIB * MIB
                    swap_tok = m.swap_on("zram", swap_size, disksize=disksize)
                    disk_tok = m.swap_on("swap-disk", swap_size)
                    row["zram_disksize_mib"] = disksize // MIB
                else:
                    swap_tok = m.swap_on("zram", swap_size)
                row["zram_disk_fallback"] = disk_tok is not None
                write(f"{ZRAM}/mem_limit", share)
                cg_limit = limit - share
                row["zram_share_mib"] = share // MIB
                row["zram_algorithm"] = read(f"{ZRAM}/comp_algorithm")
            elif peer != "local":
                dport = common.free_port()
                donor = Proc(self.donor_prefix() + [self.bin["memlendd"], "--lend", human(self.far() + 256 * MIB),
                                                     "--listen", f"127.0.0.1:{dport}", "--insecure"]
                             + self.donor_args(peer),
                             os.path.join(self.workdir, f"memlendd_{tag}.log"))
                common.wait_port(dport)
                self.donor_pid = donor.proc.pid
                local = limit - (oh or 0)
                if not self.has_mem:
                    if local < 16 * MIB:
                        raise Skip(f"LIMIT {limit // MIB} MiB leaves no local budget after {(oh or 0) // MIB} "
                                   f"MiB overhead")
                    row["memlend_local_mib"] = local // MIB
                else:
                    row["memlend_mem_mib"] = limit // MIB
                row["memlend_args"] = self.memlend_peer_args(peer)

                def wrap(argv):
                    return self.memlend_argv(dport, row["memlend_args"], limit, argv, local)
                cg_limit = limit
            yield cg_limit, wrap
        finally:
            self.donor_pid = None
            if donor is not None:
                row["donor_peak_mib"] = donor_peak_mib(donor.proc.pid)
                donor.kill(signal.SIGTERM)
            if zswap is not None:
                self.zswap_off(*zswap)
            if disk_tok is not None:
                m.swap_off("swap-disk", disk_tok)
            if swap_tok is not None:
                m.swap_off("zram" if peer == "zram" else "swap-disk", swap_tok)
            if pc_tok is not None:
                write("/proc/sys/vm/page-cluster", m.page_cluster)
                UNDO.done(pc_tok)

    def run_peer(self, app, mix, peer, frac, limit, records, oh):
        """run(), and once more with a gentle load if the memcg OOM killer ended the server
        during a full-speed load: 16 connections x 64 SETs in flight fill memory at ~100-200
        MB/s, faster than swap to this disk can take it (memcached, 512 MiB at 25%: killed 1.7 s
        into its load once, fine in the next cell). The row says so."""
        row = self.run(app, mix, peer, frac, limit, records, oh)
        if peer != "local" and row.get("cg_oom_kills") and row.get("load_failed"):
            first = row
            log("    OOM-killed during the load: once more, loading through 1 connection x 8 in flight")
            row = self.run(app, mix, peer, frac, limit, records, oh, gentle=True)
            row["first_try"] = {k: first.get(k) for k in ("note", "load_s", "cg_max_usage_mib", "pswpout", "zswpout",
                                                          "cg_usage_after_load_mib")}
            row["note"] = ("the first try was OOM-killed in a full-speed load; this is the rerun with a gentle "
                           "load; " + (row.get("note") or "")).rstrip("; ")
        return row

    def run(self, app, mix, peer, frac, limit, records, oh, gentle=False):
        """One run of `app` under `peer`: load, warm-up, timed phase, verification. The row."""
        a, m = self.a, self.machine
        mix_name, read_pct = mix
        row = {"app": app.name, "mix": mix_name, "read_pct": read_pct, "peer": peer, "frac_pct": frac,
               "limit_mib": None if peer == "local" else limit // MIB, "records": records,
               "size_mib": a.size // MIB, "values": a.values, "load1": round(os.getloadavg()[0], 2)}
        if self.skips.get(peer):
            row["note"] = "skipped: " + self.skips[peer]
            return row
        need = a.size * (3 if peer.startswith("memlend") or peer not in BASE_PEERS else 2) + 1024 * MIB
        avail = common.meminfo_mib("MemAvailable") * MIB
        if avail < need:
            row["note"] = f"skipped: MemAvailable {avail / MIB:.0f} MiB < {need / MIB:.0f} MiB needed"
            return row
        if peer in SWAP_PEERS and active_swaps():
            row["note"] = f"skipped: swap this run did not create is active ({', '.join(active_swaps())})"
            return row
        port = common.free_port()
        argv = app.argv(port, self.workdir, a)
        tag = f"{app.name}_{mix_name.replace('/', '-')}_{peer}_{frac or 'all'}"
        server = sampler = None
        errors, checks = [], []
        env = contextlib.ExitStack()
        try:
            try:
                cg_limit, wrap = env.enter_context(self.peer_env(peer, limit, tag, row, oh))
            except Skip as why:
                row["note"] = f"skipped: {why}"
                return row
            argv = wrap(argv)
            m.set_limit(cg_limit)
            self._empty_cg()
            try:
                write(f"{m.cg}/memory.kmem.max_usage_in_bytes", 0)
            except OSError:
                pass
            row["cg_limit_mib"] = None if cg_limit < 0 else cg_limit // MIB
            if a.wait_quiet:
                row["idle_before_pct"] = round(common.wait_quiet(a.wait_quiet, 80), 1)
            busy = other_benchmarks()
            if busy:
                row["disturbed_by"] = busy
            log("  +", " ".join(argv) + (f"   (memcg limit {row['cg_limit_mib']} MiB)" if cg_limit >= 0 else ""))
            vm0, t_run0 = vmstat_all(), time.time()
            row["foreign_at_start"] = foreign_procs()
            holder = {}

            def stall_kill():
                if holder.get("server") is not None and holder["server"].poll() is None:
                    os.killpg(holder["server"].proc.pid, signal.SIGKILL)

            sampler = Sampler(stall_kill if peer == "zram" else None)
            server = holder["server"] = Proc(argv, os.path.join(self.workdir, f"server_{tag}.log"), m.cg)
            app.ready(port, server)
            # load: every record once, untimed, inside the limit
            load = ["--threads", "1", "--load-pipeline", "8"] if gentle else ["--threads", str(a.threads)]
            row["load_args"] = " ".join(load)
            res = run_json(self.ycsb_args(app, port, records, ["--load"] + load), max(600, records / 200))
            row["load_s"] = res.get("seconds")
            row["load_ops_per_s"] = res.get("ops_per_s")
            if "error" in res or res.get("errors") or res.get("ops") != records:
                errors.append(f"load: {res.get('error') or res.get('first_error') or res.get('ops')}")
                row["load_failed"] = True
            row["cg_usage_after_load_mib"] = round((cg_read(m, "memory.usage_in_bytes") or 0) / MIB, 1)
            common_args = ["--threads", str(a.threads), "--pipeline", str(a.pipeline), "--read-pct", str(read_pct)]
            # warm-up: untimed, 2x records ops or --warm-seconds
            if not errors and server.poll() is None:
                res = run_json(self.ycsb_args(app, port, records, common_args +
                                              ["--ops", str(2 * records), "--seconds", str(a.warm_seconds),
                                               "--seed", str(a.seed + 1000)]), a.warm_seconds + 180)
                row["warm_ops"], row["warm_s"] = res.get("ops"), res.get("seconds")
                row["warm_ops_per_s"] = res.get("ops_per_s")
                row["warm_misses"] = res.get("misses")
                if "error" in res or res.get("errors") or res.get("misses") or res.get("bad_values"):
                    errors.append(f"warm-up: {res.get('error') or res.get('first_error') or ''} "
                                  f"misses {res.get('misses')} bad {res.get('bad_values')}")
            # the timed phase
            bgsave = None
            if not errors and server.poll() is None:
                vm1, psi1, live1 = vmstat_all(), common.cpu_psi_total_us(), memlend_live()
                donor_cpu1 = proc_cpu_s(getattr(self, "donor_pid", None))
                bgsave = BgSave(port, a.seconds + 600) if a.bgsave and app.name == "redis" else None
                trace = StallTrace(m.cg, os.path.join(self.workdir, f"perf_{tag}.data")) if a.trace else None
                if bgsave:
                    bgsave.start()
                res = run_json(self.ycsb_args(app, port, records, common_args +
                                              ["--seconds", str(a.seconds), "--seed", str(a.seed + 2000)]),
                               a.seconds + 180)
                if trace:
                    trace.stop()
                    if res.get("max_at_unix_s") and res.get("max_us"):
                        row["max_at_unix_s"] = res["max_at_unix_s"]
                        row["trace_around_max"] = trace.around(res["max_at_unix_s"], res["max_us"] / 1e6)
                        row["handler_stacks_around_max"] = trace.perf_around(res["max_at_unix_s"] - 0.1,
                                                                             res["max_us"] / 1e6 + 0.1)
                if bgsave:
                    bgsave.join(a.seconds + 660)
                    row.update(bgsave.out)
                    if not bgsave.out.get("bgsave_ok"):
                        errors.append(f"BGSAVE failed: {bgsave.out.get('bgsave_error') or 'status not ok'}")
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.workdir, "dump.rdb"))
                vm2, psi2, live2 = vmstat_all(), common.cpu_psi_total_us(), memlend_live()
                donor_cpu2 = proc_cpu_s(getattr(self, "donor_pid", None))
                if donor_cpu1 is not None and donor_cpu2 is not None and res.get("ops"):
                    row["donor_cpu_s"] = round(donor_cpu2 - donor_cpu1, 2)
                    row["donor_cpu_us_per_op"] = round((donor_cpu2 - donor_cpu1) * 1e6 / res["ops"], 1)
                for k in ("ops", "seconds", "ops_per_s", "reads", "updates", "misses", "bad_values", "errors",
                          "p50_us", "p99_us", "p999_us", "mean_us", "max_us", "client_cpu_s", "first_error"):
                    row[k] = res.get(k)
                row["ycsb_exit"] = res.get("exit")
                if "error" in res:
                    errors.append(f"timed: {res['error']}")
                elif res.get("errors") or res.get("misses") or res.get("bad_values"):
                    errors.append(f"timed: {res.get('errors')} errors ({res.get('first_error')}), "
                                  f"{res.get('misses')} misses, {res.get('bad_values')} bad values")
                if psi1 is not None and psi2 is not None and res.get("seconds"):
                    row["cpu_psi_pct"] = round((psi2 - psi1) / 1e6 / res["seconds"] * 100, 1)
                for k in ("pswpin", "pswpout", "zswpin", "zswpout", "zswpwb"):
                    row[f"timed_{k}"] = vm2[k] - vm1[k]
                if any(live2.values()):  # a memlend peer (or a variant of one)
                    for k in LIVE_KEYS:
                        row[f"timed_{k}"] = live2[k] - live1[k]
                add_pages_in(row)
                # is the client the bottleneck? the same load with twice the threads, between two
                # runs as is (this machine is shared: one pair alone was too noisy to read)
                if peer == "local" and a.client_check and not errors:
                    res3 = []
                    for i, nt in enumerate((a.threads, 2 * a.threads, a.threads)):
                        res3.append(run_json(self.ycsb_args(app, port, records, [
                            "--threads", str(nt), "--pipeline", str(a.pipeline), "--read-pct", str(read_pct),
                            "--seconds", str(a.client_check), "--seed", str(a.seed + 3000 + i)]),
                            a.client_check + 120))
                    if all(r3.get("ops_per_s") for r3 in res3):
                        one = (res3[0]["ops_per_s"] + res3[2]["ops_per_s"]) / 2
                        row["client_check"] = {"threads": a.threads, "threads_2x": 2 * a.threads,
                                               "seconds_each": a.client_check,
                                               "ops_per_s_1x_2x_1x": [r3["ops_per_s"] for r3 in res3],
                                               "client_cpu_s_1x_2x_1x": [r3.get("client_cpu_s") for r3 in res3]}
                        row["x_2x_threads"] = round(res3[1]["ops_per_s"] / one, 3)
            # verification (not of a server that already stopped answering)
            dead = any("connection lost" in e or "did not finish" in e for e in errors)
            if dead and server.poll() is None:
                errors.append("the server stopped answering")
            if (dead or (bgsave and not bgsave.out.get("bgsave_ok"))) and server.poll() is None:
                row["stall_tasks"] = task_stacks(m.cg)
                print("    stalled; its tasks:\n" + "\n".join("      " + t for t in row["stall_tasks"]))
            if server.poll() is None and not dead:
                try:
                    cnt = app.count(port)
                    row.update({k: v for k, v in cnt.items() if k != "items"})
                    row["items"] = cnt["items"]
                    if cnt["items"] != records:
                        checks.append(f"{'DBSIZE' if app.name == 'redis' else 'curr_items'} {cnt['items']} != "
                                      f"{records}")
                    if cnt.get("evictions"):
                        checks.append(f"{cnt['evictions']} evictions")
                except (OSError, RedisError, KeyError, ValueError) as e:
                    checks.append(f"count: {type(e).__name__}: {e}")
                res = run_json(self.ycsb_args(app, port, records, ["--threads", "1", "--zipf", "0", "--read-pct",
                                                                   "100", "--ops", str(CHECK_KEYS), "--seed",
                                                                   str(a.seed + 5000)]), 300)
                row["check_reads"], row["check_misses"] = res.get("reads"), res.get("misses")
                row["check_bad"] = res.get("bad_values")
                if "error" in res or res.get("reads") != CHECK_KEYS or res.get("misses") or res.get("bad_values"):
                    checks.append(f"read-back of {CHECK_KEYS} random keys: {res.get('error') or ''} "
                                  f"{res.get('reads')} read, {res.get('misses')} missing, "
                                  f"{res.get('bad_values')} wrong")
            elif server.poll() is not None:
                errors.append(f"the server exited ({server.returncode})")
            row["cg_usage_end_mib"] = round((cg_read(m, "memory.usage_in_bytes") or 0) / MIB, 1)
            if peer == "zram":
                z = zram_mm_stat()
                if z:
                    row["zram_mem_used_max_mib"] = round(z["used_max"] / MIB, 1)
                    row["zram_orig_mib"] = round(z["orig"] / MIB, 1)
                    row["zram_compr_mib"] = round(z["compr"] / MIB, 1)
                    if z["compr"]:
                        row["zram_ratio"] = round(z["orig"] / z["compr"], 2)
            if peer == "zswap":
                row["zswap_pool_end_mib"] = round((meminfo_kib("Zswap") or 0) / 1024, 1)
                row["zswapped_end_mib"] = round((meminfo_kib("Zswapped") or 0) / 1024, 1)
            # stop: memlend prints its summary when the server ends
            if not dead:
                app.stop(port, server)
                if server.wait(180) is None:
                    errors.append("the server did not exit within 180 s of its stop")
            row["exit"] = server.returncode
            vm3 = vmstat_all()
            for k in ("pswpin", "pswpout", "zswpin", "zswpout", "zswpwb"):
                row[k] = vm3[k] - vm0[k]
            row["wall_s"] = round(time.time() - t_run0, 1)
        except Exception as e:  # one failed run does not end the benchmark
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            if sampler is not None:
                pk = sampler.stop()
                if sampler.stalled:
                    row["zram_failed_writes"] = sampler.stalled
                    errors.insert(0, f"zram full at its mem_limit ({row.get('zram_share_mib')} MiB): "
                                     f"{sampler.stalled:,} failed swap-outs, the server stalled and was killed")
                if peer == "zswap":
                    row["zswap_pool_peak_mib"] = round(pk["zswap_pool_kib"] / 1024, 1)
                    row["zswapped_peak_mib"] = round(pk["zswapped_kib"] / 1024, 1)
            if server is not None:
                server.kill(signal.SIGKILL)
                out = server.output()
                if peer.startswith("memlend") or peer in self.variants:
                    row.update(memlend_summary(out))
                if errors or checks:
                    row["log_tail"] = out[-1500:]
            row.update(m.cg_stats())
            row["cg_failcnt"] = cg_read(m, "memory.failcnt")  # charges that hit the limit (and reclaimed)
            kmem = cg_read(m, "memory.kmem.max_usage_in_bytes")
            if kmem is not None:
                row["cg_kmem_max_usage_mib"] = round(kmem / MIB, 1)
            env.close()  # the donor, zswap, swap and vm.page-cluster, after the server is gone
        add_total(row)
        notes = []
        if row.get("cg_oom_kills"):
            what = f"memcg limit {row['cg_limit_mib']} MiB"
            notes.append(f"OOM-killed ({row['cg_oom_kills']} kill(s) by the memcg, {what})")
        notes += errors + checks
        if row.get("disturbed_by") or other_benchmarks():
            notes.append("another benchmark ran meanwhile")
        row["foreign_at_end"] = foreign_procs()
        foreign = sorted({x.split(":")[0] for x in row.get("foreign_at_start", []) + row["foreign_at_end"]})
        if foreign:
            notes.append("not ours, running too: " + ",".join(foreign))
        if (peer.startswith("memlend") or peer in self.variants) and row.get("exit") not in (0, None):
            notes.append(f"memlend run exit {row['exit']}")
        row["ok"] = not errors and not checks and not row.get("cg_oom_kills")
        if notes:
            row["note"] = "; ".join(notes)[:400]
        return row


FOREIGN = {"memlend", "memlendd", "cargo", "rustc", "cc1", "ld", "redis-server", "memcached", "fio", "touch",
           "ycsb_load", "redis-benchmar", "nbdkit", "qemu-img", "qemu-nbd"}


def foreign_procs():
    """Busy programs on this 2-core machine that this run did not start (another engineer's
    tests, a build): 'comm:pid', for the row, since they disturb the numbers."""
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        comm = st[st.index("(") + 1:st.rindex(")")]
        if comm not in FOREIGN:
            continue
        pid, ours = int(d), False
        for _ in range(64):  # is it a descendant of this run?
            try:
                with open(f"/proc/{pid}/stat") as f:
                    s2 = f.read()
            except OSError:
                break
            pid = int(s2[s2.rindex(")") + 2:].split()[1])
            if pid == me:
                ours = True
                break
            if pid <= 1:
                break
        if not ours:
            out.append(f"{comm}:{d}")
    return out


# memlend's counters that say where a page came back from (`memlend top`'s live files)
LIVE_KEYS = ("faults_from_store", "faults_from_pool", "faults_write_protect", "pages_written_back")


def task_stacks(cg):
    """Every thread in memory cgroup `cg`: 'pid/tid comm state wchan | kernel stack', for a
    run that stalled: where each one waits (the kernel stack needs root)."""
    out = []
    try:
        with open(os.path.join(cg, "cgroup.procs")) as f:
            pids = [p.strip() for p in f if p.strip()]
    except OSError as e:
        return [f"cannot list {cg}: {e}"]
    for pid in pids[:64]:
        with contextlib.suppress(OSError):
            for tid in sorted(os.listdir(f"/proc/{pid}/task"))[:64]:
                d = f"/proc/{pid}/task/{tid}"
                parts = []
                for name in ("comm", "wchan", "stack"):
                    try:
                        with open(f"{d}/{name}") as f:
                            parts.append(f.read().strip().replace("\n", " < "))
                    except OSError as e:
                        parts.append(f"({name}: {e.strerror})")
                try:
                    with open(f"{d}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    state = "?"
                out.append(f"{pid}/{tid} {parts[0]} {state} {parts[1]} | {parts[2][:600]}")
    return out


def memlend_live():
    """LIVE_KEYS summed over the live files of the memlend processes running now. Each process
    rewrites its file every second, so a window's counts are within a second of its edges."""
    out = dict.fromkeys(LIVE_KEYS, 0)
    for path in glob.glob("/run/memlend-live/*.json") + glob.glob("/tmp/memlend-live-*/*.json"):
        pid = os.path.basename(path)[:-len(".json")]
        if not pid.isdigit() or not os.path.exists(f"/proc/{pid}"):
            continue  # a process killed before it could remove its file
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        for k in LIVE_KEYS:
            out[k] += int(d.get(k) or 0)
    return out


def add_pages_in(row):
    """in_per_op: pages brought back into the program's memory per timed operation, whatever
    from (a disk or zram swap-in, a zswap load, a memlend store or pool fault): the miss count
    the policies are judged by, apart from what each miss costs."""
    ops = row.get("ops")
    if not ops:
        return
    keys = ("timed_pswpin", "timed_zswpin", "timed_faults_from_store", "timed_faults_from_pool")
    row["in_per_op"] = round(sum(row.get(k) or 0 for k in keys) / ops, 3)


def vmstat_all():
    out = dict.fromkeys(("pswpin", "pswpout", "zswpin", "zswpout", "zswpwb"), 0)
    out.update(vmstat())
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k in out:
                out[k] = int(v)
    return out


# ---- ratios, plot, table ---------------------------------------------------------------------------


def zswap_total_limit(rows, app, mix, frac):
    """The total memory (bytes, whole MiB up) the zswap peer of this cell peaked at, if it ran."""
    for r in rows:
        if (r.get("app"), r.get("mix"), r.get("frac_pct"), r.get("peer")) == (app, mix, frac, "zswap"):
            if r.get("ok") and r.get("total_peak_mib"):
                return int(-(-r["total_peak_mib"] // 1)) * MIB
    return None


def add_total(row):
    """total_peak_mib: the memcg's peak plus what the compressed peers hold outside it (zram's
    pool always; zswap's where this kernel did not charge it to the memcg)."""
    total = row.get("cg_max_usage_mib")
    if total is None:
        return
    total += row.get("zram_mem_used_max_mib") or 0  # never charged to the memcg
    pool = row.get("zswap_pool_peak_mib")
    if pool:
        # charged, the pool would be kernel memory of the memcg (v1 counts kmem in its usage)
        row["zswap_pool_charged"] = (row.get("cg_kmem_max_usage_mib") or 0) >= 0.5 * pool
        if not row["zswap_pool_charged"]:
            total += pool
    row["total_peak_mib"] = round(total, 1)


def add_ratios(rows):
    def key(r):
        return r["app"], r["mix"]

    local = {key(r): r["ops_per_s"] for r in rows if r["peer"] == "local" and r.get("ops_per_s")}
    ref = {(key(r), r["frac_pct"], r["peer"]): r["ops_per_s"] for r in rows
           if r["peer"] in ("swap-disk", "zswap") and r.get("ops_per_s") and r.get("ok")}
    for r in rows:
        v = r.get("ops_per_s")
        if not v or not r.get("ok"):
            continue
        lo = local.get(key(r))
        if lo:
            r["x_local"] = round(v / lo, 4)
        if r["peer"] != "local":
            for p, col in (("swap-disk", "x_swap"), ("zswap", "x_zswap")):
                b = ref.get((key(r), r["frac_pct"], p))
                if b and r["peer"] != p:
                    r[col] = round(v / b, 2)


COLORS = {"local": "#555555", "swap-disk": "#c0392b", "zswap": "#8e44ad", "zram": "#e67e22",
          "memlend-donor": "#2471a3", "memlend-zswap-total": "#1abc9c"}
EXTRA_COLORS = ["#17a589", "#5dade2", "#0b5345", "#a9cce3"]


def plot(path, rows, peers, title, names=APPS):
    """ops/s over all-local against the local fraction: a panel per app (of `names`) x mix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apps = [a for a in names if any(r["app"] == a for r in rows)]
    mixes = []
    for r in rows:
        if r["mix"] not in mixes:
            mixes.append(r["mix"])
    fracs = sorted({r["frac_pct"] for r in rows if r.get("frac_pct")})
    fig, axes = plt.subplots(len(apps), len(mixes), figsize=(4.8 * len(mixes), 3.9 * len(apps)), squeeze=False)
    extra = iter(EXTRA_COLORS * 4)
    colors = {p: COLORS.get(p) or next(extra) for p in peers}
    for i, app in enumerate(apps):
        for j, mix in enumerate(mixes):
            ax = axes[i][j]
            cell = [r for r in rows if r["app"] == app and r["mix"] == mix]
            for peer in peers:
                if peer == "local":
                    continue
                pts = sorted((r["frac_pct"], r["x_local"]) for r in cell if r["peer"] == peer and r.get("x_local"))
                failed = sorted(r["frac_pct"] for r in cell if r["peer"] == peer and not r.get("x_local")
                                and not (r.get("note") or "").startswith("skipped"))
                if pts:
                    ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", color=colors[peer], label=peer)
                if failed:  # OOM-killed or failed: marked on the floor of the panel
                    ax.plot(failed, [1e-3] * len(failed), "x", color=colors[peer], markersize=9,
                            label=f"{peer}: failed/OOM" if not pts else None)
            ax.axhline(1.0, color=COLORS["local"], linestyle=":", linewidth=1, label="all local")
            ax.set_yscale("log")
            ax.set_ylim(8e-4, 1.5)
            ax.set_xticks(fracs)
            ax.set_xticklabels([f"{f}%" for f in fracs])
            if len(fracs) == 1:
                ax.set_xlim(fracs[0] - 10, fracs[0] + 10)
            ax.set_xlabel("memory: % of the all-local server's usage")
            ax.set_ylabel("ops/s ÷ all-local")
            ax.set_title(f"{app}, {mix}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(title, 130)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


COLUMNS = [
    Column("app", "app"),
    Column("mix", "mix"),
    Column("frac_pct", "mem%", "{}%"),
    Column("peer", "peer"),
    Column("limit_mib", "LIMIT MiB", "{:,}"),
    Column("ops_per_s", "ops/s", "{:,.0f}"),
    Column("x_local", "x local", "{:.3f}"),
    Column("x_swap", "x swap", "{:.2f}"),
    Column("x_zswap", "x zswap", "{:.2f}"),
    Column("p50_us", "p50 us", "{:,.0f}"),
    Column("p99_us", "p99 us", "{:,.0f}"),
    Column("p999_us", "p99.9 us", "{:,.0f}"),
    Column("cg_max_usage_mib", "memcg peak", "{:,.0f}"),
    Column("total_peak_mib", "total MiB", "{:,.0f}"),
    Column("timed_pswpin", "swap-ins", "{:,}"),
    Column("store_faults", "store faults", "{:,}"),
    Column("donor_peak_mib", "donor MiB", "{:,.0f}"),
    Column("donor_cpu_us_per_op", "donor cpu us/op", "{:.1f}"),
    Column("in_per_op", "in/op", "{:.2f}"),
    Column("fault_p50_us", "fault p50 us", "{:.1f}"),
    Column("fault_p50_x_floor", "x floor", "{:.2f}"),
    Column("cpu_psi_pct", "cpu wait%", "{:.0f}"),
    Column("bgsave_s", "BGSAVE s", "{:.1f}"),
    Column("fork_ms", "fork ms", "{:.1f}"),
    Column("x_2x_threads", "2x thr", "{:.2f}"),
    Column("ok", "ok"),
    Column("note", "note"),
]


def parse_mixes(text):
    out = []
    for part in text.split(","):
        name, _, pct = part.partition("=")
        if not pct:
            name, pct = (f"{name}/{100 - int(name)}" if int(name) < 100 else "read-only"), name
        out.append((name, int(pct)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="512 MiB, fraction 25, mixes read-only and 95/5, 20 s")
    ap.add_argument("--apps", default="redis,memcached", help="subset of redis,memcached")
    ap.add_argument("--size", help="the loaded server's resident size (default 768M; --quick 512M)")
    ap.add_argument("--fractions", help="memory for the limited peers, %% of the all-local usage (default 25,50,75)")
    ap.add_argument("--mixes", help="NAME=READ_PCT,... (default read-only=100,95/5=95,50/50=50)")
    ap.add_argument("--peers", help="subset of " + ",".join(BASE_PEERS) + " and the --memlend-variant names")
    ap.add_argument("--seconds", type=float, help="timed phase per run (default 30; --quick 20)")
    ap.add_argument("--warm-seconds", type=float, help="bound on the warm-up of 2x records ops (default --seconds)")
    ap.add_argument("--threads", type=int, default=16, help="client connections (one thread each)")
    ap.add_argument("--pipeline", type=int, default=1, help="requests in flight per connection")
    ap.add_argument("--value-size", type=int, default=1024)
    ap.add_argument("--values", default="text", choices=("text", "ycsb"))
    ap.add_argument("--zipf", type=float, default=0.99, help="theta (0: uniform)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--zram-share", type=float, default=0.5,
                    help="zram's mem_limit: a fraction of LIMIT (< 1) or bytes; the memcg gets the rest")
    ap.add_argument("--zram-ratio", type=float, default=2.0,
                    help="zram's disksize = its share x this, with swap to disk below it for what does "
                         "not fit (0: zram alone, disksize the whole dataset, which stalls once full)")
    ap.add_argument("--memlend-overhead", type=float, metavar="MIB",
                    help="memlend: --local = LIMIT - this (default: measured empty usage + 16 MiB + size/64)")
    ap.add_argument("--memlend-args", default="", help="appended to every `memlend run` (e.g. \"--compress lz4\")")
    ap.add_argument("--memlend-variant", action="append", default=[], metavar="NAME=ARGS",
                    help="another memlend peer NAME: memlend-donor with ARGS appended (repeatable); "
                         "with --ssd DIR in ARGS, far pages go to a file there instead of the donor")
    ap.add_argument("--donor-variant", action="append", default=[], metavar="PEER=ARGS",
                    help="extra memlendd arguments for one memlend peer (e.g. \"memlend-donor=--spin-us 0\")")
    ap.add_argument("--page-cluster-compressed", default="0", metavar="N|asis",
                    help="vm.page-cluster for zswap and zram runs (default 0, as zram setups use: with this "
                         "machine's 3, zswap was memcg-OOM-killed at 50%%; swap readahead decompresses 8 "
                         "pages a fault into the memcg); restored after each run")
    ap.add_argument("--page-cluster-disk", default="asis", metavar="N|asis",
                    help="vm.page-cluster for swap-disk runs (default: as found)")
    ap.add_argument("--memcached-threads", type=int, default=2, help="memcached -t (2 cores here)")
    ap.add_argument("--memcached-args", default="", help="more memcached arguments, for every peer "
                    "(e.g. \"-o no_lru_maintainer,no_lru_crawler\")")
    ap.add_argument("--client-check", type=float, default=8, metavar="S",
                    help="in each all-local run, S s as is, S s with the client's threads doubled, S s as is (0: don't)")
    ap.add_argument("--wait-quiet", type=float, default=5, metavar="S",
                    help="before each run wait up to S s for the CPUs to be >= 80%% idle (0: don't)")
    ap.add_argument("--bgsave", action="store_true", help="redis: BGSAVE at the start of each timed phase; "
                    "the fork's child writes the dataset while the load runs, and its time is in the table")
    ap.add_argument("--trace", action="store_true", help="sample the memcg, reclaim counters and every "
                    "thread every 10 ms in the timed phase; the row keeps the samples around its slowest "
                    "operation (trace_around_max; bench/stall_trace.py)")
    ap.add_argument("--force", action="store_true", help="run even if another benchmark is running")
    ap.add_argument("--split-cpus", action="store_true",
                    help="the borrower (server, client, memlend's threads, every peer's) on CPU 0 only and "
                    "memlend's donor on CPU 1 only: the donor as another machine would be")
    ap.add_argument("--name", default="apps")
    a = ap.parse_args()
    if a.split_cpus:
        # Every child inherits CPU 0; the donor alone is moved to CPU 1 (Runner.donor_prefix).
        os.sched_setaffinity(0, {0})
    q = a.quick
    a.size = parse_size(a.size or ("512M" if q else "768M"))
    fracs = [int(f) for f in (a.fractions or ("25" if q else "25,50,75")).split(",")]
    mixes = parse_mixes(a.mixes or ("read-only=100,95/5=95" if q else "read-only=100,95/5=95,50/50=50"))
    a.seconds = a.seconds or (20 if q else 30)
    a.warm_seconds = a.warm_seconds or a.seconds
    apps = a.apps.split(",")
    for x in apps:
        if x not in SERVERS:
            raise SystemExit(f"unknown app {x}; apps are {', '.join(APPS)}")
    variants = {}
    for v in a.memlend_variant:
        name, sep, args = v.partition("=")
        if not sep or not name or name in BASE_PEERS or name in variants:
            raise SystemExit(f"--memlend-variant {v!r}: want NAME=ARGS with a new NAME")
        variants[name] = args
    all_peers = BASE_PEERS + list(variants)
    peers = a.peers.split(",") if a.peers else all_peers
    for p in peers:
        if p not in all_peers:
            raise SystemExit(f"unknown peer {p}; peers are {', '.join(all_peers)}")
    if "local" not in peers:
        peers = ["local"] + peers  # every ratio, and LIMIT, needs it
    tools = {"redis": ["redis-server"], "memcached": ["memcached"]}
    for app in apps:
        for tool in tools[app]:
            if shutil.which(tool) is None:
                raise SystemExit(f"{tool} is missing: apt-get install {'redis-server' if app == 'redis' else app}")

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)
    workdir = tempfile.mkdtemp(prefix="apps.", dir="/var/tmp")  # a real disk, not tmpfs
    UNDO.push(f"rm -r {workdir}", lambda: shutil.rmtree(workdir, ignore_errors=True))
    atexit.register(UNDO.run)  # a last resort; the finally below normally empties it
    t_start = time.time()
    floors = {}
    rows, skips, stamps, cal, busy, has_mem = [], {}, {}, {}, None, False
    machine = Machine(workdir)
    machine.cg = os.path.join(CG_ROOT, f"apps_{os.getpid()}")
    try:
        busy = other_benchmarks()
        if busy:
            if not a.force:
                raise SystemExit(f"another benchmark is running, and 2 cores shared make both wrong; try "
                                 f"again when it is done (or --force):\n{busy}")
            log(f"WARNING: another benchmark is running; the numbers will be disturbed:\n{busy}")
        machine.preflight(True, "zram" in peers)
        if machine.swap_skip and "root" in machine.swap_skip or "no cgroup" in (machine.swap_skip or ""):
            raise SystemExit(f"cannot run: {machine.swap_skip} (every peer runs in a memory cgroup)")
        skips.update({"swap-disk": machine.swap_skip, "zswap": machine.swap_skip, "zram": machine.zram_skip})
        if not os.path.exists(ZSWAP):
            skips["zswap"] = "no zswap in this kernel"
        why, binp, stamps = snapshot_memlend(workdir)
        if why:
            for p in ["memlend-donor"] + list(variants):
                skips[p] = why
        else:
            h = subprocess.run([binp["memlend"], "run", "--help"], capture_output=True, text=True).stdout
            has_mem = "--mem " in h
        skips = {k: v for k, v in skips.items() if v and k in peers}
        for k, v in skips.items():
            log(f"{k}: skipped: {v}")
        machine.cgroup()
        ycsb = os.path.join(workdir, "ycsb_load")
        sh(["cc", "-O2", "-Wall", "-pthread", "-o", ycsb, os.path.join(HERE, "ycsb_load.c"), "-lm"])
        bench = Bench(a, machine, workdir, ycsb, binp, skips, variants, has_mem)
        n_cell = 0
        floors = common.measure_floors(a.wait_quiet)
        log(common.fmt_floors(floors))
        for app_name in apps:
            app = SERVERS[app_name]
            per_rec, empty = bench.calibrate(app)
            records = int((a.size - empty) / per_rec)
            c = cal[app_name] = {"bytes_per_record": round(per_rec, 1), "empty_usage_mib": round(empty / MIB, 1),
                                 "records": records}
            log(f"== {app_name}: {per_rec:.0f} B of memcg usage per record of {a.value_size} B, empty server "
                f"{empty / MIB:.1f} MiB: {records:,} records for {human(a.size)}")
            oh = None
            if any(p.startswith("memlend") or p in variants for p in peers if p not in skips):
                usage, peak = bench.memlend_overhead(app)
                c["memlend_empty_usage_mib"] = round(usage / MIB, 1)
                c["memlend_empty_peak_mib"] = round(peak / MIB, 1)
                margin = 16 * MIB + a.size // 64
                oh = int(a.memlend_overhead * MIB) if a.memlend_overhead is not None else usage + margin
                c["memlend_overhead_mib"] = round(oh / MIB, 1)
                c["memlend_overhead_from"] = ("--memlend-overhead" if a.memlend_overhead is not None else
                                              f"measured {usage / MIB:.1f} MiB + margin {margin / MIB:.0f} MiB")
                if has_mem:
                    c["memlend_overhead_used"] = False
                log(f"   memlend overhead: {oh / MIB:.1f} MiB ({c['memlend_overhead_from']}; the empty server "
                    f"under memlend --local 64M peaked at {peak / MIB:.1f} MiB)" +
                    ("; NOT USED: memlend run has --mem, so the memlend peers get --mem LIMIT" if has_mem else ""))
            base = None
            for mix in mixes:
                log(f"== {app_name} {mix[0]}: local")
                row = bench.run_peer(app, mix, "local", None, None, records, oh)
                rows.append(row)
                log("   ", json.dumps({k: row.get(k) for k in ("ops_per_s", "p50_us", "p99_us", "cg_max_usage_mib",
                                                             "x_2x_threads", "ok", "note")}))
                if base is None:
                    if not row.get("cg_max_usage_mib") or not row.get("ok"):
                        raise SystemExit(f"the all-local {app_name} run failed, so LIMIT has no base: "
                                         f"{row.get('note')}")
                    base = int(row["cg_max_usage_mib"] * MIB)
                    c["local_usage_mib"] = row["cg_max_usage_mib"]
                    c["limits_mib"] = {f: base * f // 100 // MIB for f in fracs}
                    log(f"   LIMIT base: the all-local peak {base / MIB:.0f} MiB; limits "
                        + ", ".join(f"{f}% = {v} MiB" for f, v in c["limits_mib"].items()))
                others = [p for p in peers if p != "local"]
                for f in fracs:
                    limit = base * f // 100 // MIB * MIB
                    k = n_cell % max(1, len(others))
                    n_cell += 1
                    late = [p for p in others if p == AT_ZSWAP_TOTAL]
                    others_now = [p for p in others if p not in late]
                    k = k % max(1, len(others_now))
                    for peer in others_now[k:] + others_now[:k] + late:
                        peer_limit = limit
                        if peer == AT_ZSWAP_TOTAL:
                            peer_limit = zswap_total_limit(rows, app_name, mix[0], f)
                            if peer_limit is None:
                                rows.append({"app": app_name, "mix": mix[0], "peer": peer, "frac_pct": f,
                                             "note": "skipped: no zswap run in this cell to match"})
                                continue
                        log(f"== {app_name} {mix[0]} {f}% ({peer_limit // MIB} MiB): {peer}")
                        row = bench.run_peer(app, mix, peer, f, peer_limit, records, oh)
                        rows.append(row)
                        log("   ", json.dumps({k: row.get(k) for k in ("ops_per_s", "p50_us", "p99_us",
                                                                     "cg_max_usage_mib", "total_peak_mib",
                                                                     "timed_pswpin", "store_faults", "in_per_op", "ok",
                                                                     "note")}))
    finally:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # let the cleanup finish
            signal.signal(s, signal.SIG_IGN)
        UNDO.run()
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_DFL)
        if active_swaps():
            print(f"WARNING: swap still active after cleanup: {active_swaps()}", file=sys.stderr)
        if os.path.isdir(machine.cg):
            print(f"WARNING: {machine.cg} still there after cleanup", file=sys.stderr)
    if not rows:
        return
    add_ratios(rows)
    floor = floors.get("floor_same_p50_us")
    for r in rows:
        if r.get("fault_p50_us") and floor:
            r["fault_p50_x_floor"] = round(r["fault_p50_us"] / floor, 2)
    order = {p: i for i, p in enumerate(peers)}
    mix_order = {m[0]: i for i, m in enumerate(mixes)}
    rows.sort(key=lambda r: (APPS.index(r["app"]), mix_order[r["mix"]], r["frac_pct"] or 0, order[r["peer"]]))
    zs_rows = [r for r in rows if r["peer"] == "zswap" and r.get("zswap_pool_peak_mib")]
    meta = {
        "apps": apps, "size_mib": a.size // MIB, "fractions_pct": fracs, "mixes": dict(mixes), "peers": peers,
        "memlend_variants": variants, "donor_variants": a.donor_variant, "memlend_args": a.memlend_args, "memlend_has_mem_option": has_mem,
        "seconds": a.seconds, "warm_seconds": a.warm_seconds, "warm_ops": "2x records", "threads": a.threads,
        "bgsave": a.bgsave, "split_cpus": a.split_cpus,
        "pipeline": a.pipeline, "value_size": a.value_size, "values": a.values, "zipf": a.zipf,
        "key_chooser": "YCSB ScrambledZipfianGenerator (10^10 ranks, fnvhash64 mod records)" if a.zipf else
        "uniform", "seed": a.seed, "zram_share": a.zram_share, "zram_ratio": a.zram_ratio, "memcached_threads": a.memcached_threads,
        "memcached_args": a.memcached_args,
        "calibration": cal, "skips": skips, "check_keys": CHECK_KEYS, "client_check_s": a.client_check,
        "zswap_compressor": next((r.get("zswap_compressor") for r in zs_rows), None),
        "zswap_pool_charged_to_memcg": sorted({r.get("zswap_pool_charged") for r in zs_rows}, key=str) or None,
        "other_benchmark_running_at_start": busy, "wait_quiet_s": a.wait_quiet,
        "page_cluster": machine.page_cluster, "zswap_was": machine.zswap0,
        "thp": read("/sys/kernel/mm/transparent_hugepage/enabled"), "nproc": os.cpu_count(),
        "kernel": os.uname().release, "wall_s": round(time.time() - t_start),
        "redis": subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip(),
        "memcached": subprocess.run(["memcached", "-V"], capture_output=True, text=True).stdout.strip()
        if shutil.which("memcached") else None,
        "git_head": sh(["git", "-C", common.ROOT, "rev-parse", "--short", "HEAD"], check=False).stdout.strip(),
        "memlend_build_mtimes": stamps, "floors": floors,
    }
    title = (f"apps: {', '.join(apps)}, {human(a.size)} loaded, {a.value_size} B {a.values} values, zipf "
             f"{a.zipf} (YCSB scrambled), {a.threads} connections x {a.pipeline} in flight, {a.seconds:g} s timed; "
             f"every limited peer: total memory = mem% of all-local usage, in one memcg"
             + ("; every peer on CPU 0, memlend's donor on CPU 1" if a.split_cpus else ""))
    print()
    report(a.name, rows, COLUMNS, meta=meta, title=title)
    print(common.fmt_floors(floors) + " (x floor: memlend's store-fault p50, message read to wake, over the same-core floor)")
    png = os.path.join(common.RESULTS, a.name + ".png")
    plot(png, rows, peers, title)
    print("wrote", os.path.relpath(png))
    for app_name, c in cal.items():
        print(f"{app_name}: {c['records']:,} records, {c['bytes_per_record']} B each; all-local usage "
              f"{c.get('local_usage_mib')} MiB; memlend overhead {c.get('memlend_overhead_mib')} MiB "
              f"({c.get('memlend_overhead_from')})" + ("; not used: --mem LIMIT" if has_mem else ""))
    print(f"wall time: {meta['wall_s'] / 60:.1f} min")
    bad = [r for r in rows if r.get("ok") is False]
    if bad:
        print(f"{len(bad)} run(s) failed or were OOM-killed: " +
              "; ".join(f"{r['app']} {r['mix']} {r['frac_pct']}% {r['peer']}: {r.get('note')}" for r in bad))


if __name__ == "__main__":
    main()
