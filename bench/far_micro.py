#!/usr/bin/python3
"""Far-memory micro benchmark: one program (bench/touch.c) touches a region of
SIZE bytes, uniform random / zipf(0.99) / sequential, 50% writes, and a
sequential read ("scan", no writes), with a local budget of 100/50/25/10% of
SIZE, under each peer in the same run.

    sudo /usr/bin/python3 bench/far_micro.py            # = --quick
    sudo /usr/bin/python3 bench/far_micro.py --full     # 1, 4, 16 GiB x 4 patterns x 4 budgets
    sudo /usr/bin/python3 bench/far_micro.py --sizes 1G,4G --budgets 100,25 --patterns zipf
         [--ops N] [--seconds S] [--peers local,swap-disk,...] [--no-verify] [--name far_micro]

--quick: 1 GiB, all four patterns, budgets 100% and 25%. --full: the whole
matrix of issue 3 section 4 (long: a 16 GiB cell under disk swap alone takes
minutes). Every cell is bounded: at most --ops touches and --seconds seconds
in the timed phase (and a bounded untimed warm-up), then a read-back of every
page (--verify in touch.c); a run that reads a wrong byte fails its row.

--split-cpus: touch.c, memlend's threads and the kernel peers' program on CPU 0 only, the
donors on CPU 1 only, as other machines would be (without it the donors share both cores with
the program and its handler).

The peers (same program, same arguments, same run; their order rotates from
cell to cell so drift in machine load favours none):

  local          no limit: the region is plain RAM. All ratios divide by it.
  swap-disk      kernel swap to a swapfile on the local disk (/var/tmp, ext4 on
                 /dev/vda), the program in a cgroup v1 memory cgroup limited to
                 the budget (+ a small slack for what it holds outside the
                 region: text, stack, page tables). zswap off, page-cluster as found.
  zram           the same cgroup limit, swap on /dev/zram0 (zswap's compressor: lz4 if the
                 kernel's crypto API has it, else lzo). The data is
                 incompressible, so zram saves no memory here: it is the
                 "swap to local RAM" bound, not a far-memory answer.
  memlend-donor  `memlend run --local BUDGET --donor 127.0.0.1:PORT --insecure
                 -- touch ...`, with `memlendd --lend ... --insecure` started here.
                 BUDGET is the budget + 1 MiB: --local counts far pages only, and
                 the malloc'd block is one page larger than the region.
                 memlend, memlendd and libmemlend_preload.so are copied out of
                 target/release when the run starts, so one run is one build
                 (their mtimes are in the JSON).
  memlend-donors2, memlend-donors3
                 the same over 2 or 3 loopback donors (--donor repeated: pages
                 striped in 256 KiB chunks), each lending 1/n of the region.
                 Not in the default set: --peers local,memlend-donor,memlend-donors2,...
  memlend-ssd    `memlend run --local BUDGET --ssd DIR -- touch ...`, DIR on
                 the same disk as the swapfile. The cache+ column checks that
                 its "far" pages really leave RAM: before commit 4340e51 the
                 file was buffered and a 4 GiB region grew the page cache by
                 4 GiB; since then it is O_DIRECT.
  memlend-ssd-cg the same inside the swap peers' cgroup limit, so everything
                 memlend holds (its bookkeeping, any page cache) counts against
                 the budget as the swap cache does for kernel swap. It passes
                 --far SIZE+256M (the swapfile's size): with the default far
                 size (up to 64 GiB) memlend's bookkeeping did not fit the
                 cgroup slack and the memcg OOM killer ended the run.

The floor, measured in the same run with shared/tools/floors: one userfaultfd
missing fault fixed by UFFDIO_COPY (uffd_bench) plus one TCP loopback round
trip of 16 B request / 4 KiB reply (net_bench), p50, both with the handler on
the same core (the best case) and on the other core. TCP stream bandwidth is
measured too, for the sequential target.

Reported per row: touches/s (at a small budget most touches fault, so this
is faults/s), latency p50/p99 of sampled single touches (about 1 in 64, at
random gaps), throughput as a ratio to all-local ("x local") and to swap-disk
of the same cell ("x swap"), p50 over the same-core floor, populate rate, the
read-back time, the process's peak RSS, how much the host's page cache grew
while it ran ("cache+": a file store that goes through the page cache keeps
its "far" pages in this machine's RAM), and the share of the run in which
some task waited for a CPU ("cpu wait%", PSI; this machine has 2 cores and is
shared, and memlend's own threads count too, so a high figure marks a row as
possibly disturbed). All-local runs before and after each size x pattern
group; the ratios divide by the mean of the two. Prints a table and the
issue's targets as met/MISS, writes bench/results/NAME.json (every field of
every run, memlend's own summary lines, the floors, the skips) and NAME.png
(throughput / all-local against the budget, one line per peer, a panel per
size and pattern). Before each run it waits up to --wait-quiet seconds for
the CPUs to be 80% idle. --quick takes about 20 minutes here.

If `target/release/memlend run` does not exist yet, the memlend rows are
marked "skipped: ..." and everything else runs.

The machine is left as found on every exit path (normal, error, Ctrl-C,
SIGTERM, SIGHUP): swapoff, swapfile removed, zram0 reset, cgroup removed,
zswap restored, children stopped. Swap peers are skipped, with a message, if
any swap is already active or zram0 is in use when the run starts. Needs root.
"""

import argparse
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from report import Column, report  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = ["local", "swap-disk", "zram", "memlend-donor", "memlend-donors2", "memlend-donors3", "memlend-ssd",
         "memlend-ssd-cg"]
# The striped peers answer "1 to 3 donors"; ask for them with --peers.
DEFAULT_PEERS = [p for p in PEERS if not p.startswith("memlend-donors")]


def donor_count(peer):
    """How many loopback donors a memlend peer stripes over (0: none)."""
    if peer == "memlend-donor":
        return 1
    return int(peer[len("memlend-donors"):]) if peer.startswith("memlend-donors") else 0
# "scan" is "seq" with no writes: a sequential read, what the issue's
# "sequential scan >= 0.5x TCP stream" target measures. At 50% writes
# ("seq") every page also goes back over the wire, twice the traffic.
PATTERNS = ["uniform", "zipf", "seq", "scan"]


def touch_args(pattern, write_pct):
    """touch.c's pattern and write share for one of PATTERNS."""
    return ("seq", 0) if pattern == "scan" else (pattern, write_pct)
CG_ROOT = "/sys/fs/cgroup/memory"
ZRAM = "/sys/block/zram0"
ZSWAP = "/sys/module/zswap/parameters/enabled"
MIB = 1 << 20
GIB = 1 << 30


def log(*a):
    print(*a, flush=True)


def sh(argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def kernel_compressor():
    """The compressor both kernel peers use, so zswap and zram compare like with like: lz4 if the
    kernel's crypto API has it (zswap takes its compressor from there), else lzo, which every kernel
    has (zswap's default here: these kernels build no lz4 into the crypto API)."""
    with open("/proc/crypto") as f:
        names = {line.split(":", 1)[1].strip() for line in f if line.startswith("name")}
    return "lz4" if "lz4" in names else "lzo"


def write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def read(path):
    with open(path) as f:
        return f.read().strip()


def parse_size(text):
    t = text.strip().upper().rstrip("IB").rstrip("B")
    mult = {"K": 1 << 10, "M": MIB, "G": GIB, "T": 1 << 40}.get(t[-1:], 1)
    return int(float(t.rstrip("KMGT")) * mult)


def human(n):
    return f"{n / GIB:g}G" if n % GIB == 0 else f"{n // MIB}M"


def active_swaps():
    with open("/proc/swaps") as f:
        return [line.split()[0] for line in f.read().splitlines()[1:] if line.strip()]


class Undo:
    """A stack of things to put back; run() undoes them all, newest first, and
    keeps going past failures. Runs on every exit path (finally, atexit,
    signals turned into SystemExit)."""

    def __init__(self):
        self.steps = []

    def push(self, what, fn):
        self.steps.append((what, fn))
        return len(self.steps) - 1

    def done(self, token):
        """The step was undone by its owner already."""
        if token is not None and token < len(self.steps):
            self.steps[token] = (None, None)

    def run(self):
        while self.steps:
            what, fn = self.steps.pop()
            if fn is None:
                continue
            try:
                fn()
            except Exception as e:  # keep undoing the rest
                print(f"cleanup: {what}: {e}", file=sys.stderr, flush=True)


UNDO = Undo()


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)


# ---- the machine: cgroup, swapfile, zram ------------------------------------


class Machine:
    def __init__(self, workdir):
        self.workdir = workdir
        self.cg = os.path.join(CG_ROOT, f"far_micro_{os.getpid()}")
        self.swapfile = os.path.join(workdir, "swapfile")
        self.swapfile_size = 0
        self.swap_skip = None
        self.oom_kills0 = 0
        self.zram_skip = None
        self.zswap0 = read(ZSWAP) if os.path.exists(ZSWAP) else None
        self.page_cluster = read("/proc/sys/vm/page-cluster")

    def preflight(self, want_swap, want_zram):
        if os.geteuid() != 0:
            self.swap_skip = self.zram_skip = "needs root (cgroup, swapon)"
            return
        if not os.path.isdir(CG_ROOT) or not os.path.exists(os.path.join(CG_ROOT, "memory.limit_in_bytes")):
            self.swap_skip = self.zram_skip = f"no cgroup v1 memory controller at {CG_ROOT}"
            return
        swaps = active_swaps()
        if swaps:
            msg = f"this machine already has swap active ({', '.join(swaps)}); not touching it"
            self.swap_skip = self.zram_skip = msg
            return
        if want_zram:
            if not os.path.exists(ZRAM):
                self.zram_skip = "no /dev/zram0"
            elif read(f"{ZRAM}/disksize") != "0":
                self.zram_skip = "zram0 is in use (disksize != 0); not touching it"
        if want_swap and shutil.which("mkswap") is None:
            self.swap_skip = "mkswap missing"
        if (want_swap or want_zram) and self.zswap0 == "Y":
            write(ZSWAP, "N")
            UNDO.push("restore zswap", lambda: write(ZSWAP, self.zswap0))

    # the cgroup exists for the whole run; its limit changes per cell
    def cgroup(self):
        if not os.path.isdir(self.cg):
            os.mkdir(self.cg)
            UNDO.push(f"rmdir {self.cg}", self._rmdir_cg)
        return self.cg

    def _rmdir_cg(self):
        for _ in range(50):
            try:
                os.rmdir(self.cg)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)  # a child still exiting
        os.rmdir(self.cg)

    def set_limit(self, limit):
        cg = self.cgroup()
        write(f"{cg}/memory.limit_in_bytes", limit)
        for f in ("memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes", "memory.failcnt"):
            try:
                write(f"{cg}/{f}", 0)
            except OSError:
                pass

    def cg_stats(self):
        cg = self.cg
        out = {"cg_max_usage_mib": int(read(f"{cg}/memory.max_usage_in_bytes")) / MIB}
        oom = dict(line.split() for line in read(f"{cg}/memory.oom_control").splitlines())
        out["cg_oom_kills"] = int(oom.get("oom_kill", 0)) - self.oom_kills0
        self.oom_kills0 += out["cg_oom_kills"]
        try:
            out["cg_memsw_max_usage_mib"] = int(read(f"{cg}/memory.memsw.max_usage_in_bytes")) / MIB
        except OSError:
            pass
        return out

    def make_swapfile(self, size):
        if self.swapfile_size >= size:
            return
        self.drop_swapfile()
        UNDO.push(f"rm {self.swapfile}", self.drop_swapfile)
        sh(["fallocate", "-l", str(size), self.swapfile])
        os.chmod(self.swapfile, 0o600)
        sh(["mkswap", self.swapfile])
        self.swapfile_size = size

    def drop_swapfile(self):
        if self.swapfile in active_swaps():
            sh(["swapoff", self.swapfile], check=False)
        if os.path.exists(self.swapfile):
            os.unlink(self.swapfile)
        self.swapfile_size = 0

    def swap_on(self, peer, size, disksize=None):
        """Make `peer`'s swap active; returns the undo token. zram's disksize is the whole
        region and 256 MiB (incompressible pages take 4 KiB each) unless `disksize` says."""
        if peer == "swap-disk":
            self.make_swapfile(size + 256 * MIB)
            tok = UNDO.push(f"swapoff {self.swapfile}", lambda: sh(["swapoff", self.swapfile], check=False))
            sh(["swapon", self.swapfile])  # default priority: below zram's 100
            return tok
        tok = UNDO.push("reset zram0", self.zram_off)
        algs = read(f"{ZRAM}/comp_algorithm")
        if kernel_compressor() in algs.replace("[", " ").replace("]", " ").split():
            write(f"{ZRAM}/comp_algorithm", kernel_compressor())
        write(f"{ZRAM}/disksize", disksize or size + 256 * MIB)
        sh(["mkswap", "/dev/zram0"])
        sh(["swapon", "-p", "100", "/dev/zram0"])
        return tok

    def swap_off(self, peer, tok):
        if peer == "swap-disk":
            sh(["swapoff", self.swapfile])
        else:
            self.zram_off()
        UNDO.done(tok)

    def zram_off(self):
        if "/dev/zram0" in active_swaps():
            sh(["swapoff", "/dev/zram0"], check=False)
        if read(f"{ZRAM}/disksize") != "0":
            write(f"{ZRAM}/reset", 1)


# ---- running the touch program -----------------------------------------------


def build_touch(workdir):
    out = os.path.join(workdir, "touch")
    sh(["cc", "-O2", "-Wall", "-o", out, os.path.join(HERE, "touch.c"), "-lm"])
    return out


MEMLEND_FILES = ("memlend", "memlendd", "libmemlend_preload.so")
BIN = {}  # name -> path of this run's snapshot


def snapshot_memlend(workdir):
    """Copy memlend, memlendd and the preload shim out of target/release into
    the run's work dir, so every row of the run uses one build even if
    someone rebuilds meanwhile. Returns (why not, or None; {file: mtime})."""
    rel = common.release_dir()
    p = os.path.join(rel, "memlend")
    if not os.path.exists(p):
        return f"{p} is missing (cargo build --release -p memlend)", {}
    r = subprocess.run([p, "run", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        return "`memlend run` is not there yet in target/release/memlend (" + \
               (r.stderr.strip().splitlines() or ["?"])[0] + ")", {}
    d = os.path.join(workdir, "bin")
    os.makedirs(d, exist_ok=True)
    stamps = {}
    for name in MEMLEND_FILES:
        src = os.path.join(rel, name)
        if not os.path.exists(src):
            return f"{src} is missing", stamps
        stamps[name] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime(src)))
        shutil.copy2(src, os.path.join(d, name))
        BIN[name] = os.path.join(d, name)
    return None, stamps


# ["taskset", "-c", "1"] under --split-cpus: each donor on a core of its own, as another machine.
DONOR_PREFIX = []


class Donor:
    """memlendd (this run's snapshot) on 127.0.0.1:port, in its own session;
    stop() ends it (also from the undo stack)."""

    def __init__(self, lend, port):
        logf = open(os.path.join(os.path.dirname(BIN["memlendd"]), "memlendd.log"), "a")
        self.proc = subprocess.Popen(DONOR_PREFIX + [BIN["memlendd"], "--lend", lend, "--listen",
                                                     f"127.0.0.1:{port}", "--insecure"],
                                     stdout=logf, stderr=logf, start_new_session=True)
        self.tok = UNDO.push(f"stop memlendd {self.proc.pid}", self.stop)
        common.wait_port(port)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        UNDO.done(self.tok)


def run_child(argv, timeout_s, cgroup=None):
    """Run argv in its own session (optionally inside a cgroup); kill its process
    group on timeout or on any exit from here. Returns (rc, stdout, stderr, wall_s)."""
    def pre():
        if cgroup:
            write(f"{cgroup}/cgroup.procs", os.getpid())

    t0 = time.time()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=pre)

    def kill():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()

    tok = UNDO.push(f"kill {p.pid}", kill)
    # the host's page cache while it runs: a file store that goes through the page
    # cache keeps its "far" pages in this machine's RAM
    cache0 = common.meminfo_mib("Cached")
    peak = {"cache": cache0}
    stop = threading.Event()

    def sample():
        while not stop.wait(0.25):
            peak["cache"] = max(peak["cache"], common.meminfo_mib("Cached"))

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        out, err = p.communicate(timeout=timeout_s)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        kill()
        out, err = p.communicate()
        rc = "timeout"
    finally:
        kill()
        UNDO.done(tok)
        stop.set()
        th.join()
    return rc, out, err, time.time() - t0, peak["cache"] - cache0


def parse_touch(out):
    for line in reversed(out.splitlines()):
        if line.startswith('{"size"'):
            return json.loads(line)
    return None


def vmstat():
    keep = ("pswpin", "pswpout", "pgmajfault")
    out = {}
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k in keep:
                out[k] = int(v)
    return out


def run_cell(peer, size, budget, pattern, a, touch, machine, skips):
    row = {"size": human(size), "pattern": pattern, "budget_pct": None if peer == "local" else round(100 * budget / size),
           "budget": None if peer == "local" else human(budget), "peer": peer,
           "load1": round(os.getloadavg()[0], 2)}
    if skips.get(peer):
        row["note"] = "skipped: " + skips[peer].split(" (")[0][:70]
        return row
    # RAM this run needs: the region once. The program keeps its budget; zram or the
    # loopback donors keep the rest (incompressible data: zram saves nothing).
    need = size + 512 * MIB
    avail = common.meminfo_mib("MemAvailable") * MIB
    if avail < need:
        row["note"] = f"skipped: MemAvailable {avail / GIB:.1f} GiB < {need / GIB:.1f} GiB needed"
        return row
    pages = size // 4096
    # Warm-up: past the pages populate left resident (and dirty), whose first eviction
    # is a write-back the steady state does not have. At 16 GiB with 25% local a
    # sequential pass needs ~25 s to get past them; with a warm-up of 6 s the 16 GiB
    # seq cell measured that first quarter pass (52 K pages/s) instead of the steady
    # state (141 K with 25 s), so the warm-up bound grows with the region. Random patterns
    # must also fault about the budget's pages before the residue is gone: at 16 GiB (1 Mi
    # resident pages) a 24 s bound stopped after 0.93 M touches, and the timed phase then
    # measured 38 K touches/s against 57 K once 6 M warm-up touches had passed. So the bound
    # also allows the budget's pages at a pessimistic 25 K faults/s.
    warm_s = max(a.seconds / 2 * max(1, size / (4 * GIB)), budget / 4096 / 25_000)
    tpat, wpct = touch_args(pattern, a.write_pct)
    targs = ["--size", str(size), "--pattern", tpat, "--ops", str(a.ops), "--seconds", str(a.seconds),
             "--warmup", str(min(pages, a.ops)), "--warmup-seconds", str(warm_s),
             "--write-pct", str(wpct), "--seed", str(a.seed)]
    row["write_pct"] = wpct
    if a.verify:
        targs.append("--verify")
    # wall bound: populate + warm-up + timed + read-back at a pessimistic 2 K pages/s for the far part
    timeout_s = a.seconds + warm_s + 60 + 2 * (pages - budget // 4096) / 2000
    argv = [touch] + targs
    cgroup = None
    swap_tok = None
    daemons = []
    memlend = BIN.get("memlend")
    # memlend's --local counts far pages only; the malloc'd block is a page larger than the
    # region (its header), so give it one MiB more: at exactly the region's size a sequential
    # sweep over N+1 pages with N resident would miss on every touch
    local = human(budget + MIB)
    try:
        if peer in ("swap-disk", "zram"):
            swap_tok = machine.swap_on(peer, size)
            limit = budget + a.slack_mib * MIB + size // 512
            machine.set_limit(limit)
            cgroup = machine.cg
            row["cg_limit_mib"] = limit // MIB
        elif donor_count(peer):
            # Striped in 256 KiB chunks: each donor holds about 1/n of the region.
            n = donor_count(peer)
            donors = []
            for _ in range(n):
                port = common.free_port()
                daemons.append(Donor(human(size // n + 512 * MIB), port))
                donors += ["--donor", f"127.0.0.1:{port}"]
            argv = [memlend, "run", "--local", local, "--preload", BIN["libmemlend_preload.so"]] + donors + \
                ["--insecure", "--"] + argv
        elif peer in ("memlend-ssd", "memlend-ssd-cg"):
            ssd_dir = os.path.join(machine.workdir, "ssd")
            os.makedirs(ssd_dir, exist_ok=True)
            far = ["--far", human(size + 256 * MIB)] if peer == "memlend-ssd-cg" else []
            argv = [memlend, "run", "--local", local, "--preload", BIN["libmemlend_preload.so"]] + far + \
                ["--ssd", ssd_dir, "--"] + argv
            if peer == "memlend-ssd-cg":
                limit = budget + a.slack_mib * MIB + size // 512
                machine.set_limit(limit)
                cgroup = machine.cg
                row["cg_limit_mib"] = limit // MIB
        if a.wait_quiet:
            row["idle_before_pct"] = round(common.wait_quiet(a.wait_quiet, 80), 1)
        log("  +", " ".join(argv) + (f"   (cgroup limit {row['cg_limit_mib']} MiB)" if cgroup else ""))
        vm0, psi0 = vmstat(), common.cpu_psi_total_us()
        rc, out, err, wall, cache_growth = run_child(argv, timeout_s, cgroup)
        vm1, psi1 = vmstat(), common.cpu_psi_total_us()
        row["cache_growth_mib"] = round(cache_growth)
        if psi0 is not None and psi1 is not None:
            row["cpu_psi_pct"] = round((psi1 - psi0) / 1e6 / wall * 100, 1)
        row["wall_s"] = round(wall, 1)
        if cgroup:
            row.update(machine.cg_stats())
            if row.get("cg_oom_kills"):
                row["note"] = f"memcg OOM-killed at {row['cg_limit_mib']} MiB"
        if peer in ("swap-disk", "zram"):
            row["pswpin"] = vm1["pswpin"] - vm0["pswpin"]
            row["pswpout"] = vm1["pswpout"] - vm0["pswpout"]
    finally:
        for daemon in daemons:
            daemon.stop()
        if swap_tok is not None:
            machine.swap_off(peer, swap_tok)
    t = parse_touch(out)
    if t is None:
        row["error"] = err.strip()[-2000:] or "no output"
        row.setdefault("note", f"did not finish (exit {rc})")
        row["ok"] = None  # no data to judge; False is kept for data that read back wrong
        return row
    row.update({k: t[k] for k in ("touches_per_s", "p50_us", "p99_us", "p999_us", "lat_mean_us",
                                  "populate_mb_per_s", "populate_s", "warmup_ops", "warmup_s", "ops", "seconds",
                                  "timed_out", "verify_s", "maxrss_mib", "majflt", "checksum", "ok", "bad",
                                  "samples", "writes")})
    row["exit"] = rc
    if peer.startswith("memlend"):
        row["memlend_summary"] = [ln for ln in err.splitlines() if ln.startswith("memlend run:")]
        # Misses only, as memlend's handler times them (message read to wake): the touch's own
        # p50 above counts hits too, and is no miss latency.
        m = next((re.search(r"from the store p50 ([\d.]+) /", ln) for ln in row["memlend_summary"]
                  if "from the store p50" in ln), None)
        row["miss_p50_us"] = float(m.group(1)) if m else None
    if rc != 0:
        row["note"] = f"exit {rc}" + ("" if t["ok"] else ": data read back wrong")
        row["error"] = err.strip()[-2000:]
    elif t["timed_out"]:
        row["note"] = f"time-bounded at {a.seconds:g} s"
    return row


def merge_local(a, b):
    """One all-local row from the runs before and after a (size, pattern) group:
    touches/s and latencies are the mean; both runs are kept."""
    if not a.get("touches_per_s") or not b.get("touches_per_s"):
        return a if a.get("touches_per_s") else b
    row = dict(a)
    for k in ("touches_per_s", "p50_us", "p99_us", "p999_us", "lat_mean_us", "populate_mb_per_s"):
        row[k] = (a[k] + b[k]) / 2
    row["local_runs"] = [round(a["touches_per_s"]), round(b["touches_per_s"])]
    row["ok"] = a["ok"] and b["ok"] and a["checksum"] == b["checksum"]
    spread = abs(a["touches_per_s"] - b["touches_per_s"]) / row["touches_per_s"]
    row["note"] = f"mean of 2 runs ({spread:.0%} apart)"
    if a["checksum"] != b["checksum"]:
        row["note"] += "; the two runs' checksums differ"
    return row


# ---- floors ------------------------------------------------------------------


# ---- ratios, targets, plot ---------------------------------------------------


def add_ratios(rows, fl):
    local = {(r["size"], r["pattern"]): r.get("touches_per_s") for r in rows if r["peer"] == "local"}
    swap = {(r["size"], r["pattern"], r["budget_pct"]): r.get("touches_per_s") for r in rows
            if r["peer"] == "swap-disk"}
    ref_sum = {(r["size"], r["pattern"]): r for r in rows if r["peer"] == "local" and r.get("ok")}
    floor = fl.get("floor_same_p50_us")
    for r in rows:
        tps = r.get("touches_per_s")
        if not tps:
            continue
        lo = local.get((r["size"], r["pattern"]))
        sw = swap.get((r["size"], r["pattern"], r["budget_pct"]))
        r["x_local"] = round(tps / lo, 4) if lo else None
        r["x_swap"] = round(tps / sw, 2) if sw and r["peer"] != "local" else None
        miss = r.get("miss_p50_us")
        r["miss_p50_x_floor"] = round(miss / floor, 2) if floor and miss else None
        ref = ref_sum.get((r["size"], r["pattern"]))
        if ref and r is not ref and not r.get("timed_out") and not ref.get("timed_out") and r.get("ops") == ref.get("ops"):
            r["same_checksum"] = r["checksum"] == ref["checksum"]
            if not r["same_checksum"]:
                r["ok"] = False
                r["note"] = (r.get("note", "") + " checksum differs from local").strip()


def targets(rows, fl):
    """The issue's targets that this benchmark can judge, from this run's rows."""
    out = []

    def pick(peer, pattern, pct=None):
        c = [r for r in rows if r["peer"] == peer and r["pattern"] == pattern and r.get("touches_per_s")
             and (pct is None or r["budget_pct"] == pct)]
        return c

    floor = fl.get("floor_same_p50_us")
    for r in pick("memlend-donor", "uniform"):
        if r["budget_pct"] < 100 and floor and r.get("miss_p50_us"):
            miss = r["miss_p50_us"]
            out.append((f"store miss p50 (misses only, message read to wake) <= 1.25x floor "
                        f"({r['size']} uniform {r['budget_pct']}%)",
                        f"{miss:.1f} us = {miss / floor:.2f}x floor {floor} us (uffd COPY + TCP round trip)",
                        miss <= 1.25 * floor))
    for r in pick("memlend-donor", "zipf", 25):
        out.append((f"zipf 25% local >= 0.70x all-local ({r['size']})", f"{r['x_local']:.3f}x",
                    r["x_local"] >= 0.70))
    for r in pick("memlend-donor", "uniform"):
        if r["budget_pct"] < 100 and r.get("x_swap"):
            out.append((f"uniform >= 2x swap-disk ({r['size']} {r['budget_pct']}%)", f"{r['x_swap']:.2f}x",
                        r["x_swap"] >= 2))
    sp = fl.get("tcp_stream_pages_per_s")
    for r in pick("memlend-donor", "scan"):
        if r["budget_pct"] < 100 and sp:
            x = r["touches_per_s"] / sp
            out.append((f"sequential scan >= 0.5x TCP stream ({r['size']} {r['budget_pct']}%, read-only)",
                        f"{r['touches_per_s'] / 1e3:.0f} K pages/s = {x:.2f}x", x >= 0.5))
    for r in pick("memlend-donor", "seq"):
        if r["budget_pct"] < 100 and sp:
            x = r["touches_per_s"] / sp
            # Not judged: each touched page is read, and written back too
            # (mapped writable at 50% writes), so it moves 2 pages a touch.
            out.append((f"seq at {r.get('write_pct', 50)}% writes against TCP stream ({r['size']} "
                        f"{r['budget_pct']}%, not a target)",
                        f"{r['touches_per_s'] / 1e3:.0f} K pages/s = {x:.2f}x", None))
    sizes = sorted({r["size"] for r in rows if r["peer"] == "memlend-donor" and r.get("touches_per_s")},
                   key=parse_size)
    if len(sizes) > 1:
        for pat in PATTERNS:
            for pct in (25, 10, 50):
                a_ = [r for r in pick("memlend-donor", pat, pct) if r["size"] == sizes[0]]
                b_ = [r for r in pick("memlend-donor", pat, pct) if r["size"] == sizes[-1]]
                if a_ and b_:
                    x = b_[0]["touches_per_s"] / a_[0]["touches_per_s"]
                    out.append((f"flat cost {sizes[0]} -> {sizes[-1]} ({pat} {pct}%)", f"{x:.2f}x", x >= 0.8))
                    break
    if not any(r["peer"] == "memlend-donor" and r.get("touches_per_s") for r in rows):
        out.append(("memlend targets", "not judged: no memlend-donor rows ran", None))
    return out


COLORS = {"local": "#555555", "swap-disk": "#c0392b", "zram": "#e67e22", "memlend-donor": "#2471a3",
          "memlend-donors2": "#5dade2", "memlend-donors3": "#a9cce3",
          "memlend-ssd": "#17a589", "memlend-ssd-cg": "#0b5345"}


def plot(path, rows, fl):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["size"] for r in rows}, key=parse_size)
    pats = [p for p in PATTERNS if any(r["pattern"] == p for r in rows)]
    fig, axes = plt.subplots(len(sizes), len(pats), figsize=(4.6 * len(pats), 3.8 * len(sizes)), squeeze=False)
    for i, size in enumerate(sizes):
        for j, pat in enumerate(pats):
            ax = axes[i][j]
            cell = [r for r in rows if r["size"] == size and r["pattern"] == pat and r.get("x_local")]
            budgets = sorted({r["budget_pct"] for r in rows if r["budget_pct"]}, reverse=True)
            for peer in PEERS[1:]:
                pts = sorted(((r["budget_pct"], r["x_local"]) for r in cell if r["peer"] == peer), reverse=True)
                if pts:
                    ax.plot([budgets.index(b) for b, _ in pts], [y for _, y in pts], "o-", color=COLORS[peer],
                            label=peer)
            ax.axhline(1.0, color=COLORS["local"], linestyle=":", linewidth=1, label="all local")
            if pat == "zipf":
                ax.axhline(0.7, color="#7d3c98", linestyle="--", linewidth=1, label="target (25% local)")
            ax.set_xticks(range(len(budgets)))
            ax.set_xticklabels([f"{b}%" for b in budgets])
            ax.set_yscale("log")
            ax.set_xlabel("local budget (% of region)")
            ax.set_ylabel("touches/s ÷ all-local")
            ax.set_title(f"{size} region, {pat}, 50% writes", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("far_micro: throughput as a ratio to all-local, same run\n" + common.fmt_floors(fl)[:160], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sizes(path, rows):
    """Cost as work grows: touches/s against region size, a line per peer,
    a panel per pattern and budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["size"] for r in rows}, key=parse_size)
    cells = sorted({(r["pattern"], r["budget_pct"]) for r in rows if r["budget_pct"]})
    fig, axes = plt.subplots(1, len(cells), figsize=(5 * len(cells), 4), squeeze=False)
    for ax, (pat, pct) in zip(axes[0], cells):
        for peer in PEERS[1:]:
            pts = [(sizes.index(r["size"]), r["touches_per_s"]) for r in rows
                   if r["peer"] == peer and r["pattern"] == pat and r["budget_pct"] == pct and r.get("touches_per_s")]
            if pts:
                pts.sort()
                ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", color=COLORS[peer], label=peer)
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels(sizes)
        ax.set_xlabel("region size")
        ax.set_ylabel("touches/s")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{pat}, {pct}% local, 50% writes", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("far_micro: cost as the region grows (flat is the goal)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


COLUMNS = [
    Column("size", "size"),
    Column("pattern", "pattern"),
    Column("budget_pct", "local%", "{}%"),
    Column("peer", "peer"),
    Column("touches_per_s", "touches/s", "{:,.0f}"),
    Column("x_local", "x local", "{:.3f}"),
    Column("x_swap", "x swap", "{:.2f}"),
    Column("p50_us", "touch p50 us", "{:.2f}"),
    Column("p99_us", "touch p99 us", "{:.1f}"),
    Column("miss_p50_us", "miss p50 us", "{:.1f}"),
    Column("miss_p50_x_floor", "miss/floor", "{:.2f}"),
    Column("populate_mb_per_s", "fill MB/s", "{:,.0f}"),
    Column("verify_s", "readback s", "{:.1f}"),
    Column("maxrss_mib", "rss MiB", "{:,.0f}"),
    Column("cache_growth_mib", "cache+ MiB", "{:,.0f}"),
    Column("cpu_psi_pct", "cpu wait%", "{:.0f}"),
    Column("ok", "ok"),
    Column("note", "note"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 GiB, all patterns, budgets 100,25 (the default)")
    ap.add_argument("--full", action="store_true", help="sizes 1,4,16 GiB x patterns x budgets 100,50,25,10")
    ap.add_argument("--sizes", help="e.g. 1G,4G")
    ap.add_argument("--patterns", help="subset of uniform,zipf,seq,scan (scan: seq with no writes)")
    ap.add_argument("--budgets", help="percent of the region, e.g. 100,50,25,10")
    ap.add_argument("--peers", help="subset of " + ",".join(PEERS))
    ap.add_argument("--ops", type=int, default=20_000_000, help="touches in the timed phase, at most")
    ap.add_argument("--seconds", type=float, default=12, help="timed phase bound per cell")
    ap.add_argument("--write-pct", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--slack-mib", type=int, default=16,
                    help="cgroup limit = budget + this + size/512 (program text, stack, page tables)")
    ap.add_argument("--no-verify", dest="verify", action="store_false", help="skip the read-back of every page")
    ap.add_argument("--wait-quiet", type=float, default=10, metavar="S",
                    help="before each run wait up to S s for the CPUs to be >= 80%% idle (0: don't)")
    ap.add_argument("--split-cpus", action="store_true",
                    help="every peer's program (and memlend's threads) on CPU 0 only, memlend's donors on "
                    "CPU 1 only: the donors as other machines would be (bench/apps.py has the same)")
    ap.add_argument("--name", default="far_micro")
    a = ap.parse_args()
    if a.split_cpus:
        # Every child inherits CPU 0; donors alone are moved to CPU 1 (Donor).
        os.sched_setaffinity(0, {0})
        DONOR_PREFIX[:] = ["taskset", "-c", "1"]
    if a.full:
        sizes, budgets = ["1G", "4G", "16G"], [100, 50, 25, 10]
    else:
        sizes, budgets = ["1G"], [100, 25]
    if a.sizes:
        sizes = a.sizes.split(",")
    if a.budgets:
        budgets = [int(b) for b in a.budgets.split(",")]
    patterns = a.patterns.split(",") if a.patterns else PATTERNS
    peers = a.peers.split(",") if a.peers else DEFAULT_PEERS
    for p in peers:
        if p not in PEERS:
            raise SystemExit(f"unknown peer {p}; peers are {', '.join(PEERS)}")
    if "local" not in peers:
        peers = ["local"] + peers  # every ratio needs it

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)
    workdir = tempfile.mkdtemp(prefix="far_micro.", dir="/var/tmp")  # a real disk, not tmpfs
    UNDO.push(f"rm -r {workdir}", lambda: shutil.rmtree(workdir, ignore_errors=True))
    atexit.register(UNDO.run)  # a last resort; the finally below normally empties it
    t_start = time.time()
    rows, fl = [], {}
    machine = Machine(workdir)
    skips, stamps = {}, {}
    try:
        machine.preflight("swap-disk" in peers, "zram" in peers)
        skips = {"swap-disk": machine.swap_skip, "zram": machine.zram_skip}
        mr, stamps = snapshot_memlend(workdir)
        if mr:
            skips["memlend-donor"] = skips["memlend-ssd"] = skips["memlend-ssd-cg"] = mr
        elif machine.swap_skip and "needs root" in machine.swap_skip or "no cgroup" in (machine.swap_skip or ""):
            skips["memlend-ssd-cg"] = machine.swap_skip
        for k, v in skips.items():
            if v and k in peers:
                log(f"{k}: skipped: {v}")
        touch = build_touch(workdir)
        log("floors ...")
        fl = common.measure_floors(a.wait_quiet)
        log(common.fmt_floors(fl))
        n_cell = 0
        for size_s in sizes:
            size = parse_size(size_s)
            for pattern in patterns:
                log(f"== {human(size)} {pattern}: local")
                first_local = run_cell("local", size, size, pattern, a, touch, machine, skips)
                log("   ", json.dumps({k: first_local.get(k) for k in ("touches_per_s", "p50_us", "ok", "note")}))
                for pct in budgets:
                    budget = size * pct // 100 // MIB * MIB
                    others = [p for p in peers if p != "local"]
                    k = n_cell % max(1, len(others))
                    n_cell += 1
                    for peer in others[k:] + others[:k]:
                        log(f"== {human(size)} {pattern} {pct}%: {peer}")
                        rows.append(run_cell(peer, size, budget, pattern, a, touch, machine, skips))
                        log("   ", json.dumps({k: rows[-1].get(k) for k in
                                               ("touches_per_s", "p50_us", "p99_us", "ok", "note")}))
                # all-local again after the cell's other peers: the ratios divide by the mean
                # of the two, and the spread says how much the machine moved meanwhile
                log(f"== {human(size)} {pattern}: local again")
                rows.append(merge_local(first_local, run_cell("local", size, size, pattern, a, touch, machine,
                                                              skips)))
                log("   ", json.dumps({k: rows[-1].get(k) for k in ("touches_per_s", "local_runs", "ok", "note")}))
        # a last floor after the matrix: how much the machine drifted
        fl_end = common.measure_floors(a.wait_quiet)
        fl["end"] = {k: v for k, v in fl_end.items() if k.startswith("floor_") or k.startswith("uffd_copy_same")}
    finally:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # let the cleanup finish
            signal.signal(s, signal.SIG_IGN)
        UNDO.run()
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_DFL)
        left = active_swaps()
        if left:
            print(f"WARNING: swap still active after cleanup: {left}", file=sys.stderr)
    add_ratios(rows, fl)
    order = {p: i for i, p in enumerate(PEERS)}
    rows.sort(key=lambda r: (parse_size(r["size"]), PATTERNS.index(r["pattern"]), -(r["budget_pct"] or 101),
                             order[r["peer"]]))
    tg = targets(rows, fl)
    meta = {
        "sizes": sizes, "patterns": patterns, "budgets_pct": budgets, "peers": peers, "ops": a.ops,
        "seconds": a.seconds, "write_pct": a.write_pct, "seed": a.seed, "verify": a.verify, "split_cpus": a.split_cpus,
        "slack_mib": a.slack_mib, "wait_quiet_s": a.wait_quiet, "floors": fl, "skips": {k: v for k, v in skips.items() if v},
        "targets": [{"target": t, "measured": m, "met": ok} for t, m, ok in tg],
        "page_cluster": machine.page_cluster, "zswap_was": machine.zswap0,
        "thp": read("/sys/kernel/mm/transparent_hugepage/enabled"), "nproc": os.cpu_count(),
        "kernel": os.uname().release, "wall_s": round(time.time() - t_start),
        "git_head": sh(["git", "-C", common.ROOT, "rev-parse", "--short", "HEAD"], check=False).stdout.strip(),
        "memlend_build_mtimes": stamps,
    }
    print()
    report(a.name, rows, COLUMNS, meta=meta,
           title=f"far_micro: touch.c, {a.write_pct}% writes (scan: none), <= {a.ops:,} touches or {a.seconds:g} s per cell; "
                 "x local / x swap = touches/s over all-local / swap-disk of the same cell")
    png = os.path.join(common.RESULTS, a.name + ".png")
    plot(png, rows, fl)
    print("wrote", os.path.relpath(png))
    if len({r["size"] for r in rows}) > 1:
        png = os.path.join(common.RESULTS, a.name + ".sizes.png")
        plot_sizes(png, rows)
        print("wrote", os.path.relpath(png))
    print(common.fmt_floors(fl))
    if fl.get("end"):
        print(f"floor at the end of the run: {fl['end'].get('floor_same_p50_us')} us same core")
    print("targets:")
    for t, m, ok in tg:
        print(f"  {'met ' if ok else 'MISS' if ok is False else '  - '}  {t}: {m}")
    def where(r):
        return f"{r['peer']} {r['size']} {r['pattern']} {r['budget_pct']}%: {r.get('note')}"

    unfinished = [r for r in rows if r.get("ok") is None and not (r.get("note") or "").startswith("skipped")]
    if unfinished:
        print(f"{len(unfinished)} run(s) did not finish: " + "; ".join(where(r) for r in unfinished))
    bad = [r for r in rows if r.get("ok") is False]
    if bad:
        print(f"{len(bad)} run(s) read back WRONG data: " + "; ".join(where(r) for r in bad))
        sys.exit(1)


if __name__ == "__main__":
    main()
