#!/usr/bin/python3
"""Soak test (issue "Application speed"): redis-server, unmodified, under `memlend run --mem
LIMIT` with a loopback donor, driven by the YCSB zipfian client (bench/ycsb_load.c) for ten
minutes while the HOST sits at >= 95% memory use (a balloon holds the rest).

    sudo /usr/bin/python3 bench/soak.py                      # 600 s, LIMIT 192M, 768M of data
    sudo /usr/bin/python3 bench/soak.py --seconds 60 --size 256M --limit 96M    # a short run
         [--seconds 600] [--interval 10] [--limit 192M] [--size 4xLIMIT] [--values text|ycsb]
         [--mem-available-pct 5] [--reserve 2G] [--threads 16] [--read-pct 95] [--zipf 0.99] [--lend 2G]
         [--max-p99-ms 100] [--records N] [--memlend-args "..."] [--force] [--name soak]

Steps:
  1. calibrate: a plain redis-server (no memlend, no limit) gets 50 K records; the RSS it
     grows by per record gives the record count for --size of resident data (default 4x
     --limit), as bench/apps.py counts it from memcg usage.
  2. a loopback donor `memlendd --lend 2G --listen 127.0.0.1:PORT --insecure` (--lend grows
     to the far region + 256 MiB if that is more), and
     `memlend run --mem LIMIT --far F --donor 127.0.0.1:PORT --insecure -- redis-server
     --save '' --appendonly no --bind 127.0.0.1 --port P` (F = max(1G, 2 x size + 256M), as
     apps.py uses).
  3. load every record once (ycsb_load --load, 16 threads, pipelined SETs).
  4. inflate a balloon so that MemAvailable is <= --mem-available-pct (5%) of MemTotal:
     `memlend balloon SIZE` (a detached process that touches and mlocks SIZE) holds all but
     --reserve (2G) of what /proc/meminfo says must go; the rest is held by top-ups of at most
     256 MiB each (`memlend balloon-hold`, the balloon's own holder, started here) until
     MemAvailable is about 4% (never aiming under 3%: the margin that keeps the host out of the
     global OOM killer). The top-ups are there to be given back: a watchdog thread samples
     MemAvailable every 0.2 s and kills the newest top-up whenever it falls under 2%, so a
     program that is not ours allocating on this shared host takes memory from the balloon
     instead of pushing the kernel into the global OOM killer (the first try of this script,
     with one balloon, saw exactly that: another session's tests allocated ~1.3 GiB, and the
     kernel OOM-killed the balloon). Between intervals, top-ups are added again if MemAvailable
     rose above 5%. On this VM inflating takes about a minute: it returns freed memory to the
     host, and the first touch of fresh memory above ~13 GiB in use costs ~12 us a page.
  5. the load, in intervals (--interval 10 s; a fresh client each: ycsb_load --seconds 10
     --read-pct 95 --threads 16 --zipf 0.99, another seed each interval) until --seconds of
     load have passed. Per interval: ops/s, p50/p99/p99.9/max latency, misses, bad values,
     errors, MemAvailable (end, min over the interval), redis's and the donor's RSS, CPU
     pressure (PSI some: the machine has 2 shared cores).
  6. verify (balloon still inflated): DBSIZE equals the record count; 1000 random keys read
     back (ycsb_load --threads 1 --zipf 0 --read-pct 100 --ops 1000): every value found,
     the right size, carrying its own key and body hash. Then the balloon is released and
     redis is stopped with SHUTDOWN NOSAVE, so that memlend run prints its summary (kept).

The run FAILS (exit 1, and says why) if: an interval makes no progress (0 ops, or the client
does not finish within interval + 120 s: a deadlock) or stalls (overruns by 30 s: a request
blocked that long; the client's socket timeout is 60 s, after which the request counts as an
error); an interval has client errors, misses or bad values; the redis, memlend run, memlendd or balloon holder process died; a "Killed
process" line naming one of them, or any global OOM kill ("Out of memory: Killed process",
not a memcg's), appeared in dmesg during the run; an interval's p99 is above --max-p99-ms;
the verification fails; memlend run exits non-zero after SHUTDOWN NOSAVE. A memcg OOM kill
of a process that is not ours is reported, not failed.

Prints the per-interval table (bench/report.py), writes bench/results/NAME.json (every field,
memlend's summary lines, the balloon's size and timings) and NAME.png (ops/s and p99 per
interval against time, MemAvailable on a second axis). The machine is left as found on every
exit path (normal, error, Ctrl-C, SIGTERM, SIGHUP), through far_micro's Undo stack: balloon
released (`memlend balloon --release`, its holder killed if still there, top-ups killed),
redis, memlend run, memlendd and the client killed, the work directory removed.

Not failures, but warnings in the output and the JSON: the watchdog gave back part of the
balloon (and which programs not ours were running), MemAvailable above the target at some
sample (the "intervals_above_target" count), programs not ours running at all.

It refuses to start while another benchmark or test runs (bench/*.py, or memlend, memlendd,
redis-server, memcached, cargo, rustc or a cargo test binary that it did not start: a host
held at 95% would push them into the OOM killer; --force to run anyway), or while a balloon
that it did not make is held (`memlend balloon` would replace it). Needs root (dmesg, mlock)
and redis-server.
"""

import argparse
import atexit
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from app_redis import Proc, RedisError, Resp, memlend_summary, proc_status, snapshot_memlend  # noqa: E402
from apps import Redis, foreign_procs, run_json  # noqa: E402
from far_micro import MIB, UNDO, human, log, on_signal, parse_size, sh  # noqa: E402
from report import Column, report  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CAL_RECORDS = 50_000
CHECK_KEYS = 1000
BALLOON_PID = "/run/memlend/balloon.pid"
OTHER_BENCH = r"bench/(far_micro|nbd_fio|proto|apps|app_redis|donor_slowdown|reliability_cost|acms_fig6|soak)\.py"
LOW_PCT = 3.0  # never leave less MemAvailable than this (% of MemTotal) when inflating
DANGER_PCT = 2.0  # the watchdog drops the newest top-up below this
CHUNK = 256 * MIB  # the most one top-up holds
STALL_S = 30  # an interval that overruns by this much is a stall; the client's socket timeout is twice it


# ---- small helpers -----------------------------------------------------------------------------


def meminfo_kib():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0])
    return out


def avail_pct():
    m = meminfo_kib()
    return 100.0 * m["MemAvailable"] / m["MemTotal"], m["MemAvailable"] // 1024, m["MemTotal"] // 1024


def alive(pid):
    """Alive and not a zombie (as the balloon's procs::alive)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except OSError:
        return False
    return st[st.rindex(")") + 2:][:1] not in ("Z", "X", "")


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def balloon_holder_pid():
    """The live pid in /run/memlend/balloon.pid (a balloon-hold process), or None."""
    try:
        pid = int(open(BALLOON_PID).read().strip())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) and "balloon-hold" in cmdline(pid) else None


def holders_of(memlend_bin):
    """Every balloon-hold process started from our snapshot of memlend."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            c = cmdline(d)
            if c.startswith(memlend_bin + " balloon-hold") and alive(d):
                out.append(int(d))
    return out


def killed_lines():
    r = sh(["dmesg"], check=False)
    return [ln for ln in r.stdout.splitlines() if "killed process" in ln.lower()]


def other_benchmarks():
    me = str(os.getpid())
    lines = sh(["pgrep", "-af", OTHER_BENCH], check=False).stdout.strip().splitlines()
    return "\n".join(ln for ln in lines if ln.split()[0] != me)


def busy_others(exclude=()):
    """Programs not ours that allocate or measure memory (apps.py's foreign_procs: memlend,
    memlendd, cargo, redis, ...) and cargo test binaries (target/*/deps/*): a host held at
    95% would push them into the OOM killer, and their tests would see the pressure."""
    out = [x for x in foreign_procs() if int(x.split(":")[1]) not in exclude]
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            exe = os.readlink(f"/proc/{d}/exe")
        except OSError:
            continue
        if "/target/" in exe and "/deps/" in exe:
            out.append(f"{os.path.basename(exe)}:{d}")
    return out


class MemSampler:
    """MemAvailable (MiB) every 0.5 s, for the plot and each interval's minimum."""

    def __init__(self, t0):
        self.t0 = t0
        self.samples = []  # (s since t0, MemAvailable MiB)
        self.ev = threading.Event()
        self.th = threading.Thread(target=self.loop, daemon=True)
        self.th.start()

    def loop(self):
        while True:
            self.samples.append((round(time.time() - self.t0, 2), meminfo_kib()["MemAvailable"] // 1024))
            if self.ev.wait(0.5):
                return

    def window(self, a, b):
        return [v for t, v in self.samples if a <= t <= b]

    def stop(self):
        self.ev.set()
        self.th.join()


# ---- the balloon ---------------------------------------------------------------------------------


class Balloon:
    """`memlend balloon SIZE` (the bulk) plus top-ups of at most CHUNK each (`memlend
    balloon-hold`, the balloon's own holder, started here), so that the balloon can give memory
    back in small steps: a watchdog thread drops the newest top-up whenever MemAvailable falls
    under DANGER_PCT (something else on this shared host allocated), before the kernel's global
    OOM killer has to act. All released by release() and by the undo stack."""

    def __init__(self, memlend, workdir):
        self.memlend, self.workdir = memlend, workdir
        self.size = 0
        self.pid = None
        self.topups = []  # [(Proc, size)]
        self.ever = set()  # every holder pid, for telling our OOM kills from others'
        self.n = 0
        self.events = []
        self.tok = None
        self.lock = threading.Lock()
        self.wd_stop = threading.Event()
        self.wd = None
        self.t0 = time.time()

    def event(self, what, mib, **kw):
        self.events.append(dict(t_s=round(time.time() - self.t0, 1), what=what, mib=mib, **kw))

    def inflate(self, size):
        self.tok = UNDO.push("release the balloon", self.release)
        t0 = time.time()
        p = subprocess.Popen([self.memlend, "balloon", str(size)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=20 + 8 * (size >> 30))
        except BaseException:
            if p.poll() is None:
                p.kill()
                p.wait()
            raise
        if p.returncode != 0:
            raise RuntimeError(f"memlend balloon {human(size)} failed ({p.returncode}): {out.strip()[-400:]}")
        self.size = size
        self.pid = balloon_holder_pid()
        self.ever.add(self.pid)
        secs = time.time() - t0
        self.event("inflate", size // MIB, seconds=round(secs, 1), out=out.strip())
        return secs, out.strip()

    def top_up(self, size, why):
        """Hold `size` more, in top-ups of at most CHUNK."""
        while size > 0:
            part = min(size, CHUNK)
            size -= part
            self.n += 1
            ready = os.path.join(self.workdir, f"topup{self.n}.ready")
            t0 = time.time()
            proc = Proc([self.memlend, "balloon-hold", str(part), "--ready", ready],
                        os.path.join(self.workdir, f"topup{self.n}.log"))
            deadline = t0 + 30
            while not os.path.exists(ready):
                if proc.poll() is not None:
                    raise RuntimeError(f"balloon top-up of {part // MIB} MiB ended ({proc.returncode}): "
                                       f"{proc.output().strip()[-300:]}")
                if time.time() > deadline:
                    proc.kill()
                    raise RuntimeError(f"balloon top-up of {part // MIB} MiB not held after 30 s")
                time.sleep(0.02)
            with self.lock:
                self.topups.append((proc, part))
                self.ever.add(proc.proc.pid)
            self.event("top-up", part // MIB, seconds=round(time.time() - t0, 1), why=why)

    def drop_topup(self, why):
        with self.lock:
            if not self.topups:
                return 0
            proc, size = self.topups.pop()
        proc.kill(signal.SIGKILL)
        self.event("drop top-up", size // MIB, why=why)
        return size

    def watchdog(self, on_drop):
        def loop():
            while not self.wd_stop.wait(0.2):
                cur = avail_pct()[0]
                if cur < DANGER_PCT and self.topups:
                    size = self.drop_topup(f"watchdog: MemAvailable {cur:.2f}% < {DANGER_PCT:g}%")
                    if size:
                        on_drop(size, cur)

        self.wd = threading.Thread(target=loop, daemon=True)
        self.wd.start()

    def stop_watchdog(self):
        self.wd_stop.set()
        if self.wd is not None:
            self.wd.join()

    def held_mib(self):
        with self.lock:
            return (self.size + sum(s for _, s in self.topups)) // MIB

    def dead(self):
        """What of the balloon died (a global OOM kill picks it first: it is the biggest)."""
        out = []
        if self.pid is not None and not alive(self.pid):
            out.append(f"balloon holder {self.pid}")
        with self.lock:
            out += [f"balloon top-up {p.proc.pid}" for p, _ in self.topups if p.poll() is not None]
        return out

    def all_pids(self):
        return ([self.pid] if self.pid else []) + [p.proc.pid for p, _ in self.topups]

    def release(self):
        self.stop_watchdog()
        while self.drop_topup("release"):
            pass
        if self.tok is None:
            return
        pids = set(holders_of(self.memlend)) | ({self.pid} if self.pid else set())
        sh([self.memlend, "balloon", "--release"], check=False)
        pids |= set(holders_of(self.memlend))  # interrupted mid-inflate: no pid file yet
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # an exiting holder has an empty cmdline but still holds its memory until it is gone
        deadline = time.time() + 60
        while any(alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.1)
        UNDO.done(self.tok)
        self.tok = None
        self.pid = None


def fit_balloon(balloon, pct, target_pct, stage, settle_s=2.0):
    """Top up until MemAvailable <= pct (aiming at target_pct), never under LOW_PCT."""
    for _ in range(6):
        time.sleep(settle_s)  # let reclaim settle
        cur, avail, total = avail_pct()
        if cur <= pct:
            return cur
        extra = int((cur - target_pct) / 100 * total) * MIB
        extra = max(16 * MIB, min(extra, int((cur - LOW_PCT - 0.25) / 100 * total) * MIB))
        log(f"   MemAvailable {avail:,} MiB = {cur:.2f}% > {pct:g}%: top-up of {extra // MIB} MiB ({stage})")
        balloon.top_up(extra, f"{stage}: MemAvailable {cur:.2f}%")
    return avail_pct()[0]


# ---- plot ------------------------------------------------------------------------------------------


def plot(path, rows, samples, total_mib, pct, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True)
    t = [r["t_end_s"] for r in rows]
    a1.plot(t, [r.get("ops_per_s") or 0 for r in rows], "o-", color="#2471a3", label="ops/s")
    a1.set_ylabel("ops/s (per interval)")
    a1.set_ylim(bottom=0)
    a2.plot(t, [(r.get("p99_us") or 0) / 1000 for r in rows], "o-", color="#c0392b", label="p99")
    a2.plot(t, [(r.get("p50_us") or 0) / 1000 for r in rows], ".--", color="#e67e22", label="p50")
    a2.plot(t, [(r.get("p999_us") or 0) / 1000 for r in rows], ".:", color="#7b241c", label="p99.9")
    a2.set_ylabel("latency, ms (per interval)")
    a2.set_yscale("log")
    a2.set_xlabel("time since the load began (s)")
    for ax in (a1, a2):
        tw = ax.twinx()
        tw.plot([s[0] for s in samples], [100.0 * s[1] / total_mib for s in samples], color="#27ae60",
                linewidth=0.8, alpha=0.8, label="MemAvailable %")
        tw.axhline(pct, color="#27ae60", linestyle=":", linewidth=0.8)
        tw.set_ylabel("host MemAvailable (% of MemTotal)", color="#27ae60")
        tw.set_ylim(0, max(10, pct * 2))
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = tw.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower left")
        ax.grid(alpha=0.3)
    import textwrap

    a1.set_title("\n".join(textwrap.wrap(title, 150)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


COLUMNS = [
    Column("i", "#"),
    Column("t_end_s", "t s", "{:.0f}"),
    Column("ops", "ops", "{:,}"),
    Column("ops_per_s", "ops/s", "{:,.0f}"),
    Column("p50_us", "p50 us", "{:,.0f}"),
    Column("p99_us", "p99 us", "{:,.0f}"),
    Column("p999_us", "p99.9 us", "{:,.0f}"),
    Column("max_us", "max us", "{:,.0f}"),
    Column("bad", "miss+bad+err", "{:,}"),
    Column("mem_avail_mib", "MemAvail MiB", "{:,}"),
    Column("mem_avail_pct", "MemAvail %", "{:.2f}"),
    Column("mem_avail_min_pct", "min %", "{:.2f}"),
    Column("redis_rss_mib", "redis RSS", "{:,.0f}"),
    Column("donor_rss_mib", "donor RSS", "{:,.0f}"),
    Column("cpu_psi_pct", "cpu wait%", "{:.0f}"),
    Column("note", "note"),
]


# ---- the soak --------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600, help="load time in all (default 600)")
    ap.add_argument("--interval", type=float, default=10, help="seconds per interval (a fresh client each)")
    ap.add_argument("--limit", default="192M", help="memlend run --mem: the whole process stays within this")
    ap.add_argument("--size", help="resident redis data to load (default 4x --limit)")
    ap.add_argument("--records", type=int, help="record count (default: from --size and a calibration)")
    ap.add_argument("--values", default="text", choices=("text", "ycsb"))
    ap.add_argument("--value-size", type=int, default=1024)
    ap.add_argument("--mem-available-pct", type=float, default=5,
                    help="the balloon leaves at most this much MemAvailable (%% of MemTotal; aims at 1 less, "
                         f"never under {LOW_PCT:g})")
    ap.add_argument("--reserve", default="2G",
                    help=f"how much of the balloon is held in top-ups of <= {CHUNK // MIB} MiB that a watchdog gives "
                         f"back when MemAvailable falls under {DANGER_PCT:g}%% (default 2G)")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--read-pct", type=int, default=95)
    ap.add_argument("--zipf", type=float, default=0.99)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lend", default="2G", help="memlendd --lend (raised to the far region + 256M if smaller)")
    ap.add_argument("--max-p99-ms", type=float, default=100,
                    help="fail if an interval's p99 is above this (0: report only; default 100: ~12x the p99 of a "
                         "short run here, 8 ms, so a stall shows and a noisy neighbour does not)")
    ap.add_argument("--memlend-args", default="", help="appended to `memlend run` (e.g. \"--compress off\")")
    ap.add_argument("--force", action="store_true", help="run even if another benchmark is running")
    ap.add_argument("--name", default="soak")
    a = ap.parse_args()
    a.limit = parse_size(a.limit)
    a.size = parse_size(a.size) if a.size else 4 * a.limit
    pct = a.mem_available_pct
    target_pct = max(LOW_PCT + 0.5, pct - 1)
    if os.geteuid() != 0:
        raise SystemExit("needs root (dmesg, the balloon's mlock): sudo /usr/bin/python3 bench/soak.py")
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is missing: apt-get install redis-server")
    busy = "\n".join(x for x in [other_benchmarks()] + busy_others() if x)
    if busy:
        if not a.force:
            raise SystemExit("another benchmark or test is running; a host held at 95% memory would push it into "
                             "the OOM killer, and 2 shared cores make both wrong. Try again when it is done (or "
                             f"--force):\n{busy}")
        log(f"WARNING: another benchmark or test is running (--force):\n{busy}")
    if balloon_holder_pid():
        raise SystemExit(f"a balloon is already held (pid {balloon_holder_pid()}, {BALLOON_PID}); `memlend balloon` "
                         "would replace it. Release it first (memlend balloon --release) if it is not in use.")

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)
    workdir = tempfile.mkdtemp(prefix="soak.", dir="/var/tmp")
    UNDO.push(f"rm -r {workdir}", lambda: shutil.rmtree(workdir, ignore_errors=True))
    atexit.register(UNDO.run)  # a last resort; the finally below normally empties it

    t_start = time.time()
    failures, warnings, rows = [], [], []
    meta = {"seconds": a.seconds, "interval_s": a.interval, "limit_mib": a.limit // MIB, "size_mib": a.size // MIB,
            "values": a.values, "value_size": a.value_size, "threads": a.threads, "read_pct": a.read_pct,
            "zipf": a.zipf, "seed": a.seed, "mem_available_pct": pct, "target_pct": target_pct,
            "max_p99_ms": a.max_p99_ms, "memlend_args": a.memlend_args, "check_keys": CHECK_KEYS,
            "kernel": os.uname().release, "nproc": os.cpu_count(),
            "other_benchmark_running_at_start": busy or None, "foreign_at_start": foreign_procs(),
            "git_head": sh(["git", "-C", common.ROOT, "rev-parse", "--short", "HEAD"], check=False).stdout.strip(),
            "redis": sh(["redis-server", "--version"], check=False).stdout.strip()}
    dmesg0 = set(killed_lines())
    sampler = server = donor = balloon = None
    redis_pid = None
    summary = {}
    completed = False
    try:
        why, binp, stamps = snapshot_memlend(workdir)
        if why:
            raise SystemExit(why)
        meta["memlend_build_mtimes"] = stamps
        ycsb = os.path.join(workdir, "ycsb_load")
        sh(["cc", "-O2", "-Wall", "-pthread", "-o", ycsb, os.path.join(HERE, "ycsb_load.c"), "-lm"])
        app = Redis()

        def yargs(port, records, extra):
            return [ycsb, "--proto", "redis", "--port", str(port), "--records", str(records), "--value-size",
                    str(a.value_size), "--values", a.values, "--zipf", str(a.zipf), "--seed", str(a.seed)] + extra

        # 1. calibration: RSS per record on a plain redis-server
        records = a.records
        if not records:
            port = common.free_port()
            cal = Proc(app.argv(port, workdir, a), os.path.join(workdir, "calibrate.log"))
            try:
                app.ready(port, cal)
                time.sleep(0.3)
                r0 = proc_status(cal.proc.pid)["VmRSS"]
                res = run_json(yargs(port, CAL_RECORDS, ["--load", "--threads", "4"]), 300)
                if "error" in res or res.get("errors") or res.get("ops") != CAL_RECORDS:
                    raise RuntimeError(f"calibration load failed: {res}")
                r1 = proc_status(cal.proc.pid)["VmRSS"]
            finally:
                app.stop(port, cal)
                cal.wait(30)
                cal.kill(signal.SIGKILL)
            per_rec = (r1 - r0) * MIB / CAL_RECORDS
            records = int((a.size - r0 * MIB) / per_rec)
            meta["calibration"] = {"records": CAL_RECORDS, "empty_rss_mib": round(r0, 1),
                                   "rss_bytes_per_record": round(per_rec, 1)}
            log(f"== calibration: {per_rec:.0f} B of RSS per record of {a.value_size} B, empty redis "
                f"{r0:.1f} MiB: {records:,} records for {human(a.size)} ({a.size / a.limit:.1f}x LIMIT "
                f"{human(a.limit)})")
        meta["records"] = records

        # 2. donor and redis under memlend run
        far = max(1 << 30, 2 * a.size + 256 * MIB)
        lend = max(parse_size(a.lend), far + 256 * MIB)
        meta.update(far_mib=far // MIB, lend_mib=lend // MIB)
        dport, port = common.free_port(), common.free_port()
        donor = Proc([binp["memlendd"], "--lend", human(lend), "--listen", f"127.0.0.1:{dport}", "--insecure"],
                     os.path.join(workdir, "memlendd.log"))
        common.wait_port(dport)
        argv = ([binp["memlend"], "run", "--mem", f"{a.limit // MIB}M", "--far", human(far), "--preload",
                 binp["libmemlend_preload.so"], "--donor", f"127.0.0.1:{dport}", "--insecure"]
                + shlex.split(a.memlend_args) + ["--", "redis-server", "--save", "", "--appendonly", "no", "--bind",
                                                 "127.0.0.1", "--port", str(port), "--dir", workdir])
        meta["memlend_argv"] = " ".join(shlex.quote(x) for x in argv)
        meta["donor_argv"] = " ".join(donor.proc.args)
        log("  +", " ".join(donor.proc.args))
        log("  +", meta["memlend_argv"])
        server = Proc(argv, os.path.join(workdir, "server.log"))
        app.ready(port, server)
        r = Resp(port, timeout_s=60)
        redis_pid = int(r.info("server")["process_id"])
        r.close()
        pids = {"memlend run": server.proc.pid, "redis-server": redis_pid, "memlendd": donor.proc.pid}
        meta["pids"] = pids

        def deaths():
            out = []
            if server.poll() is not None:
                out.append(f"memlend run (pid {server.proc.pid}) exited {server.returncode}")
            if not alive(redis_pid):
                out.append(f"redis-server (pid {redis_pid}) is gone")
            if donor.poll() is not None:
                out.append(f"memlendd (pid {donor.proc.pid}) exited {donor.returncode}")
            if balloon is not None:
                out += [f"{x} is gone" for x in balloon.dead()]
            return out

        # 3. load
        t0 = time.time()
        res = run_json(yargs(port, records, ["--load", "--threads", str(a.threads)]), max(600, records / 500))
        meta["load"] = {k: res.get(k) for k in ("ops", "seconds", "ops_per_s", "errors", "first_error", "error")}
        if "error" in res or res.get("errors") or res.get("ops") != records:
            raise RuntimeError(f"load failed: {res.get('error') or res.get('first_error') or res.get('ops')}")
        rss = proc_status(redis_pid)
        log(f"== loaded {records:,} records in {time.time() - t0:.1f} s ({res.get('ops_per_s', 0):,.0f}/s); redis "
            f"RSS {rss.get('VmRSS', 0):.0f} MiB (LIMIT {a.limit // MIB} MiB), donor RSS "
            f"{proc_status(donor.proc.pid).get('VmRSS', 0):.0f} MiB")
        meta["after_load"] = {"redis_rss_mib": round(rss.get("VmRSS", 0), 1),
                              "donor_rss_mib": round(proc_status(donor.proc.pid).get("VmRSS", 0), 1)}

        # 4. the balloon
        balloon = Balloon(binp["memlend"], workdir)
        t_b0 = time.time()
        cur, avail, total = avail_pct()
        reserve = min(parse_size(a.reserve), max(0, (avail - int(total * pct / 100)) * MIB // 2))
        size = (avail - int(total * pct / 100)) * MIB - reserve
        meta["before_balloon"] = {"mem_available_mib": avail, "mem_total_mib": total, "pct": round(cur, 2)}
        if size <= 0:
            log(f"== MemAvailable is already {cur:.2f}% of MemTotal: no balloon")
        else:
            log(f"== inflating a balloon of {size / (1 << 30):.1f} GiB: MemAvailable {avail:,} MiB of {total:,} MiB "
                f"({cur:.1f}%) -> {pct:g}% + {reserve // MIB} MiB, then topped up to ~{target_pct:g}% in top-ups of "
                f"<= {CHUNK // MIB} MiB (a watchdog gives them back if MemAvailable falls under {DANGER_PCT:g}%). "
                "This takes about a minute here: "
                "this VM returns freed memory to the host, and the first touch of fresh memory above ~13 GiB "
                "in use costs ~12 us a page.")
            secs, out = balloon.inflate(size)
            log(f"   {out} in {secs:.1f} s")
        cur = fit_balloon(balloon, pct, target_pct, "after inflating")
        drops = []  # (unix time, MiB given back, MemAvailable % that made the watchdog act)
        balloon.watchdog(lambda size, c: drops.append((time.time(), size // MIB, c)))
        cur, avail, total = avail_pct()
        meta["balloon"] = {"mib": balloon.size // MIB, "holder_pid": balloon.pid, "held_mib": balloon.held_mib(),
                           "mem_available_mib": avail, "pct": round(cur, 2),
                           "inflate_s": round(time.time() - t_b0, 1), "top_ups": len(balloon.topups),
                           "reserve_mib": reserve // MIB, "chunk_mib": CHUNK // MIB}
        log(f"   balloon holds {balloon.held_mib():,} MiB; MemAvailable {avail:,} MiB = {cur:.2f}% of MemTotal")
        if cur > pct:
            raise RuntimeError(f"the balloon could not bring MemAvailable under {pct}% ({cur:.2f}%)")
        if cur < LOW_PCT:
            warnings.append(f"MemAvailable {cur:.2f}% after inflating, under the {LOW_PCT}% margin")
        dead = deaths()
        if dead:
            raise RuntimeError("died while the balloon inflated: " + "; ".join(dead))

        # 5. the load, in intervals
        log(f"== {a.seconds:g} s of load in {a.interval:g} s intervals: ycsb_load --threads {a.threads} "
            f"--read-pct {a.read_pct} --zipf {a.zipf} ({records:,} records)")
        t_load0 = time.time()
        sampler = MemSampler(t_load0)
        i = 0
        while True:
            left = a.seconds - (time.time() - t_load0)
            if left < 1:
                break
            dur = min(a.interval, left)
            ta = time.time() - t_load0
            psi0 = common.cpu_psi_total_us()
            res = run_json(yargs(port, records, ["--threads", str(a.threads), "--read-pct", str(a.read_pct),
                                                 "--seconds", f"{dur:.3f}", "--seed", str(a.seed + 100 + i),
                                                 "--timeout", str(STALL_S * 2)]),
                           dur + 120)
            tb = time.time() - t_load0
            psi1 = common.cpu_psi_total_us()
            cur, avail, total = avail_pct()
            win = sampler.window(ta, tb) or [avail]
            row = {"i": i, "t_start_s": round(ta, 1), "t_end_s": round(tb, 1), "mem_avail_mib": avail,
                   "mem_avail_pct": round(cur, 2), "mem_avail_min_pct": round(100.0 * min(win) / total, 2),
                   "mem_avail_max_pct": round(100.0 * max(win) / total, 2),
                   "redis_rss_mib": round(proc_status(redis_pid).get("VmRSS", 0), 1),
                   "donor_rss_mib": round(proc_status(donor.proc.pid).get("VmRSS", 0), 1),
                   "balloon_mib": balloon.held_mib(), "load1": round(os.getloadavg()[0], 2)}
            for k in ("ops", "seconds", "ops_per_s", "reads", "updates", "misses", "bad_values", "errors", "p50_us",
                      "p99_us", "p999_us", "mean_us", "max_us", "client_cpu_s", "first_error", "error", "exit"):
                if k in res:
                    row[k] = res[k]
            row["bad"] = (res.get("misses") or 0) + (res.get("bad_values") or 0) + (res.get("errors") or 0)
            if psi0 is not None and psi1 is not None:
                row["cpu_psi_pct"] = round((psi1 - psi0) / 1e6 / (tb - ta) * 100, 1)
            notes = []
            if "error" in res:
                notes.append(f"no progress: {res['error']}")
            elif not res.get("ops"):
                notes.append("no progress: 0 ops")
            elif tb - ta > dur + STALL_S:
                notes.append(f"stall: the {dur:g} s interval took {tb - ta:.0f} s (a request blocked; max latency "
                             f"{(res.get('max_us') or 0) / 1e6:.1f} s)")
            if row["bad"]:
                notes.append(f"{res.get('misses')} misses, {res.get('bad_values')} bad values, {res.get('errors')} "
                             f"errors ({res.get('first_error')})")
            if a.max_p99_ms and (res.get("p99_us") or 0) > a.max_p99_ms * 1000:
                notes.append(f"p99 {res['p99_us'] / 1000:.1f} ms > {a.max_p99_ms:g} ms")
            dead = deaths()
            notes += dead
            not_ours = busy_others(set(balloon.all_pids()))
            if not_ours:
                row["not_ours"] = not_ours
            gave = [d for d in drops if t_load0 + ta <= d[0] < t_load0 + tb]
            if gave:
                row["balloon_gave_back_mib"] = sum(d[1] for d in gave)
                warnings.append(f"interval {i}: the watchdog gave back {row['balloon_gave_back_mib']} MiB of the "
                                f"balloon (MemAvailable fell to {min(d[2] for d in gave):.2f}%; something else "
                                f"allocated: {', '.join(row.get('not_ours', [])) or 'nothing not ours seen now'})")
            # keep the host at the target between intervals
            if not dead and cur > pct:
                try:
                    held = balloon.held_mib()
                    cur = fit_balloon(balloon, pct, target_pct, f"interval {i}", settle_s=0.2)
                    row["top_up_mib"] = balloon.held_mib() - held
                except RuntimeError as e:
                    warnings.append(f"interval {i}: top-up failed: {e}")
            if notes:
                row["note"] = "; ".join(notes)
                failures += [f"interval {i} (t {ta:.0f}-{tb:.0f} s): {n}" for n in notes]
            rows.append(row)
            log(f"  [{i:3d}] t {tb:6.1f} s  {row.get('ops_per_s') or 0:9,.0f} ops/s  p50 {row.get('p50_us') or 0:8,.0f}"
                f"  p99 {row.get('p99_us') or 0:9,.0f}  p99.9 {row.get('p999_us') or 0:9,.0f} us  bad {row['bad']}"
                f"  MemAvailable {avail:,} MiB {cur:.2f}% (min {row['mem_avail_min_pct']:.2f}%)  redis RSS "
                f"{row['redis_rss_mib']:.0f} MiB  donor {row['donor_rss_mib']:.0f} MiB"
                + (f"  !! {row['note']}" if notes else ""))
            i += 1
            if dead or "error" in res:
                failures.append("load stopped early")
                break
        sampler.stop()
        meta["load_wall_s"] = round(time.time() - t_load0, 1)

        # 6. verify, with the balloon still held
        if not deaths():
            try:
                r = Resp(port, timeout_s=120)
                n = r.cmd("DBSIZE")
                meta["used_memory_mib"] = round(int(r.info("memory")["used_memory"]) / MIB, 1)
                r.close()
                meta["dbsize"] = n
                if n != records:
                    failures.append(f"verify: DBSIZE {n} != {records} records")
            except (OSError, RedisError, KeyError, ValueError) as e:
                failures.append(f"verify: DBSIZE: {type(e).__name__}: {e}")
            res = run_json(yargs(port, records, ["--threads", "1", "--zipf", "0", "--read-pct", "100", "--ops",
                                                 str(CHECK_KEYS), "--seed", str(a.seed + 5000)]), 300)
            meta["check"] = {k: res.get(k) for k in ("reads", "misses", "bad_values", "errors", "first_error",
                                                     "error", "seconds", "p99_us")}
            if "error" in res or res.get("reads") != CHECK_KEYS or res.get("misses") or res.get("bad_values") \
                    or res.get("errors"):
                failures.append(f"verify: read-back of {CHECK_KEYS} random keys: {res.get('error') or ''} "
                                f"{res.get('reads')} read, {res.get('misses')} missing, {res.get('bad_values')} "
                                f"wrong, {res.get('errors')} errors")
            log(f"== verify: DBSIZE {meta.get('dbsize')} (records {records:,}); {res.get('reads')} random keys read "
                f"back: {res.get('misses')} missing, {res.get('bad_values')} wrong")
        dead = deaths()
        if dead:
            failures.append("after the load: " + "; ".join(dead))
        cur, avail, _ = avail_pct()
        meta["at_end"] = {"mem_available_mib": avail, "pct": round(cur, 2),
                          "redis_hwm_mib": round(proc_status(redis_pid).get("VmHWM", 0), 1),
                          "donor_hwm_mib": round(proc_status(donor.proc.pid).get("VmHWM", 0), 1)}
        meta["balloon_events"] = balloon.events

        # release the balloon first (the host back to normal), then stop redis: memlend's summary
        balloon.release()
        if server.poll() is None:
            app.stop(port, server)
            if server.wait(180) is None:
                failures.append("memlend run did not exit within 180 s of SHUTDOWN NOSAVE")
            elif server.returncode != 0:
                failures.append(f"memlend run exited {server.returncode} after SHUTDOWN NOSAVE")
        meta["memlend_exit"] = server.returncode
        completed = True
    except Exception as e:
        failures.append(f"{type(e).__name__}: {e}")
    except SystemExit as e:
        if isinstance(e.code, int) and e.code > 128:
            log(f"\n== interrupted by signal {e.code - 128}: cleaning up (balloon, redis, memlend, donor)")
        raise
    finally:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # let the cleanup finish
            signal.signal(s, signal.SIG_IGN)
        if sampler is not None:
            sampler.stop()
        if server is not None:
            server.kill(signal.SIGKILL)
            out = server.output()
            summary = memlend_summary(out)
            if not completed or failures:
                meta["server_log_tail"] = out[-2000:]
        if donor is not None:
            donor.kill(signal.SIGTERM)
            if failures:
                meta["donor_log_tail"] = donor.output()[-1000:]
        UNDO.run()
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_DFL)
        left = [p for p in (balloon.all_pids() if balloon else []) if alive(p)]
        left += holders_of(os.path.join(workdir, "bin", "memlend"))
        if left or balloon_holder_pid():
            print(f"WARNING: balloon holder(s) still alive after cleanup: {left or balloon_holder_pid()}",
                  file=sys.stderr)
        if redis_pid and alive(redis_pid):
            print(f"WARNING: redis-server {redis_pid} still alive after cleanup", file=sys.stderr)
        if not completed:
            cur, avail, _ = avail_pct()
            log(f"== cleaned up: MemAvailable {avail:,} MiB = {cur:.1f}% of MemTotal")

    # OOM kills during the run
    ours = {str(p) for p in list(meta.get("pids", {}).values()) + (list(balloon.ever) if balloon else [])}
    new_kills = [ln for ln in killed_lines() if ln not in dmesg0]
    meta["dmesg_killed"] = new_kills
    for ln in new_kills:
        words = ln.replace("(", " ").split()
        pid = next((words[j + 1] for j, w in enumerate(words) if w.lower() == "process" and j + 1 < len(words)), "")
        if pid in ours:
            failures.append(f"OOM kill of one of ours: {ln.strip()}")
        elif "memory cgroup" not in ln.lower():
            failures.append(f"global OOM kill during the run: {ln.strip()}")
        else:
            warnings.append(f"memcg OOM kill, not ours: {ln.strip()}")
    meta.update(summary)
    meta["foreign_at_end"] = foreign_procs()
    meta["wall_s"] = round(time.time() - t_start)
    meta["failures"], meta["warnings"] = failures, warnings
    meta["ok"] = completed and not failures
    if rows:
        ok = [r for r in rows if r.get("ops_per_s")]
        p99s = sorted(r["p99_us"] for r in ok if r.get("p99_us"))
        meta["intervals"] = len(rows)
        if ok:
            meta["ops_per_s_min"] = min(r["ops_per_s"] for r in ok)
            meta["ops_per_s_mean"] = round(sum(r["ops_per_s"] for r in ok) / len(ok), 1)
            meta["ops_per_s_max"] = max(r["ops_per_s"] for r in ok)
            meta["p99_us_max"] = p99s[-1] if p99s else None
            meta["p99_us_median"] = p99s[len(p99s) // 2] if p99s else None
            meta["ops_total"] = sum(r.get("ops") or 0 for r in rows)
        meta["mem_avail_pct_min"] = min(r["mem_avail_min_pct"] for r in rows)
        meta["mem_avail_pct_max"] = max(r["mem_avail_max_pct"] for r in rows)
        meta["intervals_above_target"] = sum(1 for r in rows if r["mem_avail_max_pct"] > pct)
        meta["mem_available_samples"] = sampler.samples if sampler else []
    if completed or rows:
        title = (f"soak: redis-server under memlend run --mem {human(a.limit)} (donor on loopback), "
                 f"{meta.get('records', 0):,} x {a.value_size} B {a.values} records ({human(a.size)}), YCSB zipf "
                 f"{a.zipf}, {a.read_pct}% reads, {a.threads} threads, {a.interval:g} s intervals; host MemAvailable "
                 f"<= {pct:g}% (balloon {meta.get('balloon', {}).get('held_mib', 0):,} MiB)")
        print()
        report(a.name, rows, COLUMNS, meta=meta, title=title)
        if rows:
            png = os.path.join(common.RESULTS, a.name + ".png")
            total_mib = meminfo_kib()["MemTotal"] // 1024
            plot(png, rows, meta.get("mem_available_samples", []), total_mib, pct, title)
            print("wrote", os.path.relpath(png))
    for ln in summary.get("memlend_summary", []):
        print(ln)
    if rows:
        print(f"intervals: {len(rows)}; ops/s min {meta.get('ops_per_s_min', 0):,.0f} mean "
              f"{meta.get('ops_per_s_mean', 0):,.0f} max {meta.get('ops_per_s_max', 0):,.0f}; p99 median "
              f"{(meta.get('p99_us_median') or 0):,.0f} us, max {(meta.get('p99_us_max') or 0):,.0f} us; "
              f"MemAvailable {meta['mem_avail_pct_min']:.2f}-{meta['mem_avail_pct_max']:.2f}% of MemTotal "
              f"({meta['intervals_above_target']} interval(s) above {pct:g}% at some sample)")
    print(f"wall time: {meta['wall_s'] / 60:.1f} min")
    for w in warnings:
        print("warning:", w)
    if meta["ok"]:
        print("SOAK PASSED: progress in every interval, no process died or was OOM-killed, p99 within "
              f"{a.max_p99_ms:g} ms, every value read back right")
        return 0
    print("SOAK FAILED:" if failures else "SOAK FAILED (did not complete)")
    for f in failures:
        print("  -", f)
    return 1


if __name__ == "__main__":
    sys.exit(main())
