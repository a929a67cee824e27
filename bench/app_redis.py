#!/usr/bin/python3
"""Application benchmark: Debian's redis-server, unmodified, with a dataset
larger than its local memory budget, driven by redis-benchmark (issue 3,
section 4 "Application").

    sudo /usr/bin/python3 bench/app_redis.py            # ~15 min: headline + curve
    sudo /usr/bin/python3 bench/app_redis.py --quick    # a few minutes, small sizes
         [--budgets 256M,512M] [--sizes 256M,512M,1G,2G] [--headline 1G@256M]
         [--peers local,swap-disk,memlend-donor,memlend-ssd] [--value 1024]
         [--get-n N] [--set-n N] [--name app_redis]

The peers (same redis-server, same dataset, same redis-benchmark load, same run):

  local          redis-server with no limit: everything in RAM. Ratios divide by it.
  swap-disk      redis-server in a cgroup v1 memory cgroup limited to the budget
                 (+ a slack for what it holds outside its dataset: text, stack,
                 page tables), swapping to a swapfile on the local disk
                 (/var/tmp, made, mkswap'd and swapon'd here; zswap off).
                 The slack is --slack-mib (16) + size/512: an empty redis-server
                 holds ~3 MiB anonymous memory, and memlend's --local does not
                 count redis's memory outside the far region either (nor the
                 shim's own); the "peak RSS" column shows what each peer used.
                 If the memcg OOM killer ends redis (it did at 8 MiB of slack),
                 the run is repeated once with 32 MiB more, and the row says so.
  memlend-donor  `memlend run --local BUDGET --donor 127.0.0.1:PORT --insecure
                 -- redis-server ...`, with `memlendd --lend ... --insecure` on
                 loopback started here. redis's jemalloc gets its extents with
                 mmap, so the dataset lands in the far region.
  memlend-ssd    `memlend run --local BUDGET --ssd DIR -- redis-server ...`,
                 DIR under /var/tmp (the swapfile's disk). Only at the headline
                 point. Its file goes through the page cache and nothing limits
                 that here, so while RAM is plentiful its "far" pages sit in
                 this machine's RAM: see the "cache+" column.

Each run: start redis-server (`--save '' --appendonly no --bind 127.0.0.1`),
fill it with KEYS keys `key:%012d` (redis-benchmark's own key names) of
--value bytes each, by server-side Lua (EVAL, 50 K keys per call: exact and
deterministic, unlike `redis-benchmark -t set -r`, whose random keys collide;
DEBUG POPULATE exists but names keys `key:N` without the zero padding
redis-benchmark uses, and needs enable-debug-command). KEYS is the dataset
size divided by used_memory per key, measured on a small all-local redis at
the start. Then, untimed, a warm-up of GETs (one per page of budget, so the
dirty pages the fill left resident are written back before timing), then the
timed load:

  redis-benchmark -t get -n GET_N -r KEYS -d VALUE -P 16 -c 8 --csv
  redis-benchmark -t set -n SET_N -r KEYS -d VALUE -P 16 -c 8 --csv

Keys are uniform random over the dataset: redis-benchmark has no skewed
(zipf) key choice, so this is the worst case for any cache of hot pages.

Correctness, checked cheaply for every peer: DBSIZE equals KEYS after the
load; keyspace_misses is 0 (every GET found its key); 200 random keys read
back VALUE bytes of 'x' (what the fill and redis-benchmark SET both write);
for memlend, its summary shows faults from the store > 0 (far memory really
used) and for swap-disk the kernel swapped in (pswpin > 0), whenever the
dataset is larger than the budget.

Headline: dataset 4x the budget (1 GiB at 256 MiB; --headline), all four
peers. Curve (NEC's Figure 5, for pgbench there): GET and SET throughput
against dataset size for each budget, local vs swap-disk vs memlend-donor.
The order of swap-disk and memlend-donor alternates from cell to cell, so
drift in machine load favours neither; before each run it waits up to
--wait-quiet s for the CPUs to be 80% idle.

Prints the table and the headline, writes bench/results/NAME.json (every
field of every run, memlend's summary lines) and NAME.png. The machine is
left as found on every exit path (normal, error, Ctrl-C, SIGTERM, SIGHUP):
redis-servers and donors stopped, swapoff, swapfile removed, cgroup removed.
If swap is already active when it starts (swap this run did not create), the
swap-disk peer is skipped with a message and the machine's swap is not
touched. Needs root for the swap peer. Helpers for the cgroup and swapfile
come from far_micro.py.
"""

import argparse
import atexit
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from far_micro import (CG_ROOT, GIB, MIB, UNDO, Machine, active_swaps, human, log, on_signal,  # noqa: E402
                       parse_size, read, sh, vmstat)
from report import Column, report  # noqa: E402

PEERS = ["local", "swap-disk", "memlend-donor", "memlend-ssd"]
CURVE_PEERS = ["swap-disk", "memlend-donor"]  # the curve's far peers; local once per size
FILL_CHUNK = 50_000
FILL_LUA = ("local v = string.rep('x', tonumber(ARGV[3])) "
            "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) - 1 do "
            "redis.call('SET', string.format('key:%012d', i), v) end return 1")


# ---- a small RESP client -------------------------------------------------------


class RedisError(Exception):
    pass


class Resp:
    def __init__(self, port, timeout_s=900):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.f = self.sock.makefile("rb")

    @staticmethod
    def encode(args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def read(self):
        line = self.f.readline()
        if not line:
            raise RedisError("connection closed")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2]
        if kind == b"*":
            return [self.read() for _ in range(int(rest))]
        raise RedisError(f"bad reply {line!r}")

    def pipeline(self, cmds):
        self.sock.sendall(b"".join(self.encode(c) for c in cmds))
        return [self.read() for _ in cmds]

    def cmd(self, *args):
        return self.pipeline([args])[0]

    def info(self, section=""):
        text = self.cmd("INFO", section).decode() if section else self.cmd("INFO").decode()
        out = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def connect(port, proc, timeout_s=30):
    deadline = time.time() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited ({proc.returncode}) before listening")
        try:
            r = Resp(port)
            r.cmd("PING")
            return r
        except (OSError, RedisError):
            if time.time() > deadline:
                raise RuntimeError(f"redis-server does not answer on {port} after {timeout_s} s")
            time.sleep(0.05)


# ---- processes -------------------------------------------------------------------


class Proc:
    """A child in its own session (optionally in a cgroup), stdout+stderr to a file;
    stop() ends its process group (also from the undo stack)."""

    def __init__(self, argv, logpath, cgroup=None):
        def pre():
            if cgroup:
                with open(f"{cgroup}/cgroup.procs", "w") as f:
                    f.write(str(os.getpid()))

        self.logpath = logpath
        self.logf = open(logpath, "w")
        self.proc = subprocess.Popen(argv, stdout=self.logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=pre)
        self.tok = UNDO.push(f"stop {argv[0]} {self.proc.pid}", self.kill)

    def poll(self):
        return self.proc.poll()

    @property
    def returncode(self):
        return self.proc.returncode

    def wait(self, timeout_s):
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            if self.wait(10) is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        UNDO.done(self.tok)
        self.logf.close()

    def output(self):
        with open(self.logpath, errors="replace") as f:
            return f.read()


def snapshot_memlend(workdir):
    """Copy memlend, memlendd and the preload shim out of target/release, so the
    whole run uses one build even if someone rebuilds meanwhile.
    Returns (why not or None, {name: path}, {name: mtime})."""
    rel = common.release_dir()
    names = ("memlend", "memlendd", "libmemlend_preload.so")
    d = os.path.join(workdir, "bin")
    os.makedirs(d, exist_ok=True)
    paths, stamps = {}, {}
    for name in names:
        src = os.path.join(rel, name)
        if not os.path.exists(src):
            return f"{src} is missing (cargo build --release --workspace)", {}, {}
        stamps[name] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime(src)))
        paths[name] = os.path.join(d, name)
        shutil.copy2(src, paths[name])
    r = subprocess.run([paths["memlend"], "run", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        return "`memlend run` is not in this build", {}, {}
    return None, paths, stamps


def other_benchmarks():
    """The command lines of other benchmarks running now ('' if none): on 2 shared cores
    they disturb each other, and far_micro turns swap on and off."""
    return sh(["pgrep", "-af", r"bench/(far_micro|nbd_fio|proto)\.py"], check=False).stdout.strip()


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS", "VmSwap"):
                    out[k] = int(v.split()[0]) / 1024
    except OSError:
        pass
    return out


# ---- redis-benchmark -------------------------------------------------------------


def redis_benchmark(port, test, n, keys, value, timeout_s):
    """One redis-benchmark run; {"rps", "p50_ms", "p99_ms", "wall_s"} or {"error"}."""
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-t", test, "-n", str(n), "-r", str(keys),
            "-d", str(value), "-P", "16", "-c", "8", "--csv"]
    t0 = time.time()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    tok = UNDO.push(f"kill redis-benchmark {p.pid}", lambda: p.poll() is None and os.killpg(p.pid, signal.SIGKILL))
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {"error": f"redis-benchmark -t {test} -n {n} did not finish in {timeout_s:.0f} s"}
    finally:
        UNDO.done(tok)
    wall = time.time() - t0
    for line in out.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if cells and cells[0].upper() == test.upper():
            return {"rps": float(cells[1]), "p50_ms": float(cells[4]), "p99_ms": float(cells[6]),
                    "wall_s": round(wall, 2), "argv": " ".join(argv)}
    return {"error": f"redis-benchmark -t {test}: no result (exit {p.returncode}): {err.strip()[-300:]}"}


def fill(r, keys, value):
    t0 = time.time()
    for start in range(0, keys, FILL_CHUNK):
        r.cmd("EVAL", FILL_LUA, 0, start, min(keys, start + FILL_CHUNK), value)
    return time.time() - t0


def spot_check(r, keys, value, n=200, seed=7):
    """GET n random keys. Each value must be what the fill wrote (`value` bytes of 'x') or
    what redis-benchmark SET wrote (one buffer of `value` bytes for the whole SET run, not
    'x's). Returns the number of values that are neither."""
    rnd = random.Random(seed)
    fill_value = b"x" * value
    got = r.pipeline([("GET", f"key:{rnd.randrange(keys):012d}") for _ in range(n)])
    others = [v for v in got if v != fill_value]
    if not others:
        return 0
    common_other = max(set(others), key=others.count)
    if common_other is None or len(common_other) != value:
        return len(others)
    return sum(1 for v in others if v != common_other)


def calibrate(workdir, value, keys=50_000):
    """used_memory per key (bytes) and the empty server's RSS, on a small all-local redis."""
    port = common.free_port()
    p = Proc(redis_argv(port, workdir), os.path.join(workdir, "calibrate.log"))
    try:
        r = connect(port, p)
        m0 = int(r.info("memory")["used_memory"])
        rss0 = proc_status(int(r.info("server")["process_id"])).get("VmRSS")
        fill(r, keys, value)
        m1 = int(r.info("memory")["used_memory"])
        r.cmd("FLUSHALL")
        r.close()
    finally:
        p.kill(signal.SIGTERM)
    return (m1 - m0) / keys, m0, rss0


def redis_argv(port, workdir):
    return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", workdir, "--protected-mode", "yes"]


def memlend_summary(text):
    """memlend run's summary lines, and the counters in them."""
    import re

    lines = [ln for ln in text.splitlines() if ln.startswith("memlend run:")]
    out = {"memlend_summary": lines}
    for ln in lines:
        m = re.search(r"from the store p50 ([\d.]+) / p99 ([\d.]+) / p99.9 ([\d.]+) us", ln)
        if m:
            out["fault_p50_us"], out["fault_p99_us"], out["fault_p999_us"] = (float(g) for g in m.groups())
        m = re.search(r"p99: read ([\d.]+), making room ([\d.]+), map ([\d.]+) us", ln)
        if m:
            out["read_p99_us"], out["room_p99_us"], out["map_p99_us"] = (float(g) for g in m.groups())
        m = re.search(r"fork: (\d+) forks \((\d+) ms getting ready[:)].* wrote (\d+) dirty pages out", ln)
        if m:
            out["forks"], out["fork_pause_ms"], out["fork_pages_cleaned"] = (int(g) for g in m.groups())
        m = re.search(r"getting ready: (\d+) evicting, (\d+) on the dirty pages\)", ln)
        if m:
            out["fork_pause_evict_ms"], out["fork_pause_dirty_ms"] = (int(g) for g in m.groups())
        for key, pat in (("fork_pages_sent", r"read (\d+) far pages through their parent"),
                         ("fork_pages_copied", r"\((\d+) of them copied from its memory\)"),
                         ("fork_pages_cleaned_after", r"\((\d+) of them after the fork\)"),
                         ("fork_kept_pages_peak", r"kept at most (\d+) old pages")):
            m = re.search(pat, ln) if "fork:" in ln else None
            if m:
                out[key] = int(m.group(1))
        if "shared anonymous mapping" in ln:  # the shared-memory server's line (docs/run.md)
            for key, pat in (("shared_evicted", r"(\d+) pages evicted"),
                             ("shared_store_faults", r"(\d+) faults from the store"),
                             ("shared_zero_filled", r"(\d+) zero-filled")):
                m = re.search(pat, ln)
                if m:
                    out[key] = int(m.group(1))
            out["store_faults"] = out.get("store_faults", 0) + out.get("shared_store_faults", 0)
            continue
        if "from the store" not in ln:
            continue
        for key, pat in (("zero_filled", r"(\d+) zero-filled"), ("store_faults", r"(\d+) from the store"),
                         ("prefetched", r"(\d+) prefetched"), ("written_back", r"(\d+) written back"),
                         ("clean_dropped", r"(\d+) clean dropped")):
            m = re.search(pat, ln)
            if m:
                out[key] = int(m.group(1))
    return out


# ---- one run ---------------------------------------------------------------------


def run_one(peer, size, budget, keys, a, env):
    """redis-server under `peer` with `keys` keys; returns the row. A swap-disk run
    that the memcg OOM killer ends is repeated once with 32 MiB more slack."""
    row = run_once(peer, size, budget, keys, a, env, a.slack_mib)
    if peer == "swap-disk" and row.get("cg_oom_kills"):
        first = row
        log(f"    memcg OOM-killed at {first['cg_limit_mib']} MiB: once more with 32 MiB more slack")
        row = run_once(peer, size, budget, keys, a, env, a.slack_mib + 32)
        row["first_try"] = {k: first.get(k) for k in ("cg_limit_mib", "note", "cg_max_usage_mib")}
        row["note"] = (f"OOM-killed at {first['cg_limit_mib']} MiB, this is the rerun; "
                       + (row.get("note") or "")).rstrip("; ")
    return row


def run_once(peer, size, budget, keys, a, env, slack_mib):
    machine, workdir, binp = env["machine"], env["workdir"], env["bin"]
    row = {"peer": peer, "size": human(size), "size_mib": size // MIB,
           "budget": None if peer == "local" else human(budget),
           "budget_mib": None if peer == "local" else budget // MIB,
           "x_budget": None if peer == "local" else round(size / budget, 2), "keys": keys}
    if env["skips"].get(peer):
        row["note"] = "skipped: " + env["skips"][peer]
        return row
    need = size + 768 * MIB + (size if peer == "memlend-donor" else 0)
    avail = common.meminfo_mib("MemAvailable") * MIB
    if avail < need:
        row["note"] = f"skipped: MemAvailable {avail / GIB:.1f} GiB < {need / GIB:.1f} GiB needed"
        return row
    port = common.free_port()
    argv = redis_argv(port, workdir)
    cgroup = swap_tok = donor = server = None
    tag = f"{peer}_{human(size)}_{row['budget'] or 'all'}"
    try:
        if peer == "swap-disk":
            if active_swaps():  # someone turned swap on since the start: not ours to touch
                row["note"] = f"skipped: swap this run did not create is active ({', '.join(active_swaps())})"
                return row
            swap_tok = machine.swap_on("swap-disk", size + size // 4)
            limit = budget + slack_mib * MIB + size // 512
            machine.set_limit(limit)
            cgroup = machine.cg
            row["cg_limit_mib"] = limit // MIB
        elif peer == "memlend-donor":
            dport = common.free_port()
            donor = Proc([binp["memlendd"], "--lend", human(size * 2 + 512 * MIB), "--listen",
                          f"127.0.0.1:{dport}", "--insecure"], os.path.join(workdir, f"memlendd_{tag}.log"))
            common.wait_port(dport)
            argv = [binp["memlend"], "run", "--local", human(budget), "--preload", binp["libmemlend_preload.so"],
                    "--donor", f"127.0.0.1:{dport}", "--insecure", "--"] + argv
        elif peer == "memlend-ssd":
            ssd = os.path.join(workdir, "ssd")
            os.makedirs(ssd, exist_ok=True)
            argv = [binp["memlend"], "run", "--local", human(budget), "--preload", binp["libmemlend_preload.so"],
                    "--ssd", ssd, "--"] + argv
        if a.wait_quiet:
            row["idle_before_pct"] = round(common.wait_quiet(a.wait_quiet, 80), 1)
        busy = other_benchmarks()
        if busy:
            row["disturbed_by"] = busy
        log("  +", " ".join(argv) + (f"   (cgroup limit {row['cg_limit_mib']} MiB)" if cgroup else ""))
        vm0, psi0, cache0, t0 = vmstat(), common.cpu_psi_total_us(), common.meminfo_mib("Cached"), time.time()
        server = Proc(argv, os.path.join(workdir, f"redis_{tag}.log"), cgroup)
        r = connect(port, server)
        pid = int(r.info("server")["process_id"])
        row["fill_s"] = round(fill(r, keys, a.value), 2)
        row["fill_mb_per_s"] = round(size / MIB / row["fill_s"], 1)
        row["used_memory_mib"] = round(int(r.info("memory")["used_memory"]) / MIB, 1)
        # untimed warm-up: one GET per page of budget (at most the timed count)
        warm = min(a.get_n, (budget if peer != "local" else 64 * MIB) // 4096)
        w = redis_benchmark(port, "get", warm, keys, a.value, a.timeout)
        row["warmup_gets"], row["warmup_s"] = warm, w.get("wall_s")
        errors = [w["error"]] if "error" in w else []
        stats0 = r.info("stats")
        for test, n in (("get", a.get_n), ("set", a.set_n)):
            if errors:
                break
            b = redis_benchmark(port, test, n, keys, a.value, a.timeout)
            if "error" in b:
                errors.append(b["error"])
                continue
            row[f"{test}_rps"] = b["rps"]
            row[f"{test}_p50_ms"] = b["p50_ms"]
            row[f"{test}_p99_ms"] = b["p99_ms"]
            row[f"{test}_wall_s"] = b["wall_s"]
            row[f"{test}_argv"] = b["argv"]
        stats1 = r.info("stats")
        row["keyspace_misses"] = int(stats1["keyspace_misses"]) - int(stats0["keyspace_misses"])
        row["dbsize"] = r.cmd("DBSIZE")
        row["bad_values"] = spot_check(r, keys, a.value)
        row.update({k.lower(): round(v) for k, v in proc_status(pid).items()})
        row["cache_growth_mib"] = round(common.meminfo_mib("Cached") - cache0)
        vm1, psi1 = vmstat(), common.cpu_psi_total_us()
        wall = time.time() - t0
        if psi0 is not None and psi1 is not None:
            row["cpu_psi_pct"] = round((psi1 - psi0) / 1e6 / wall * 100, 1)
        if peer == "swap-disk":
            row["pswpin"] = vm1["pswpin"] - vm0["pswpin"]
            row["pswpout"] = vm1["pswpout"] - vm0["pswpout"]
        try:
            r.cmd("SHUTDOWN", "NOSAVE")
        except (RedisError, OSError):
            pass  # redis exits without answering
        r.close()
        if server.wait(120) is None:
            errors.append("redis-server did not exit within 120 s of SHUTDOWN NOSAVE")
        row["wall_s"] = round(time.time() - t0, 1)
        row["exit"] = server.returncode
        if peer.startswith("memlend"):
            row.update(memlend_summary(server.output()))
        # the verdict
        checks = []
        if row["dbsize"] != keys:
            checks.append(f"DBSIZE {row['dbsize']} != {keys}")
        if row["keyspace_misses"]:
            checks.append(f"{row['keyspace_misses']} GET misses")
        if row["bad_values"]:
            checks.append(f"{row['bad_values']}/200 values wrong")
        if size > budget and peer.startswith("memlend") and not row.get("store_faults"):
            checks.append("no faults from the store: far memory not used")
        if peer == "swap-disk" and row["used_memory_mib"] > row["cg_limit_mib"] and not row.get("pswpin"):
            checks.append("no swap-ins: swap not used")
        row["ok"] = not checks and not errors
        notes = errors + checks
        if row.get("disturbed_by") or other_benchmarks():
            notes.append("another benchmark ran meanwhile")
        if peer.startswith("memlend") and row["exit"] not in (0, None):
            notes.append(f"memlend run exit {row['exit']}")
        if notes:
            row["note"] = "; ".join(notes)[:300]
    except Exception as e:  # one failed run does not end the benchmark
        row["ok"] = False
        row["note"] = f"{type(e).__name__}: {e}"[:300]
        if server is not None:
            row["log_tail"] = server.output()[-2000:]
    finally:
        if server is not None:
            server.kill(signal.SIGTERM)
        if cgroup is not None:
            row.update(machine.cg_stats())
            if row.get("cg_oom_kills"):
                row["ok"] = False
                row["note"] = (f"memcg OOM-killed at {row['cg_limit_mib']} MiB; " + row.get("note", ""))[:300]
        if donor is not None:
            donor.kill(signal.SIGTERM)
        if swap_tok is not None:
            machine.swap_off("swap-disk", swap_tok)
    return row


# ---- ratios, plot ----------------------------------------------------------------


def add_ratios(rows):
    local = {r["size"]: r for r in rows if r["peer"] == "local" and r.get("get_rps")}
    swap = {(r["size"], r["budget"]): r for r in rows if r["peer"] == "swap-disk" and r.get("get_rps")}
    for r in rows:
        lo, sw = local.get(r["size"]), swap.get((r["size"], r["budget"]))
        for t in ("get", "set"):
            v = r.get(f"{t}_rps")
            if not v:
                continue
            if lo and lo.get(f"{t}_rps"):
                r[f"{t}_x_local"] = round(v / lo[f"{t}_rps"], 4)
            if sw and sw.get(f"{t}_rps") and r["peer"] != "swap-disk" and r["peer"] != "local":
                r[f"{t}_x_swap"] = round(v / sw[f"{t}_rps"], 2)


COLORS = {"local": "#555555", "swap-disk": "#c0392b", "memlend-donor": "#2471a3", "memlend-ssd": "#17a589"}


def plot(path, rows, headline, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    # 1: headline bars
    ax = axes[0]
    hs, hb = headline
    hrows = [r for r in rows if r.get("headline")]
    xs = np.arange(2)
    width = 0.8 / max(1, len(hrows))
    for i, r in enumerate(hrows):
        ys = [r.get("get_rps") or 0, r.get("set_rps") or 0]
        bars = ax.bar(xs + (i - (len(hrows) - 1) / 2) * width, ys, width, label=r["peer"],
                      color=COLORS.get(r["peer"]))
        for b, key in zip(bars, ("get_x_local", "set_x_local")):
            if r.get(key) is not None and r["peer"] != "local":
                ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{r[key]:.2f}x", ha="center",
                        va="bottom", fontsize=7)
    ax.set_xticks(xs)
    ax.set_xticklabels(["GET", "SET"])
    ax.set_yscale("log")
    ax.set_ylabel("requests/s (redis-benchmark, P16 c8)")
    ax.set_title(f"headline: {human(hs)} dataset, {human(hb)} local budget\n(labels: ratio to all-local)",
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    # 2, 3: the curve
    budgets = sorted({r["budget_mib"] for r in rows if r.get("budget_mib") and r.get("curve")})
    styles = ["-", "--", ":", "-."]
    for ax, t in zip(axes[1:], ("get", "set")):
        loc = sorted((r["size_mib"], r[f"{t}_rps"]) for r in rows if r["peer"] == "local" and r.get(f"{t}_rps"))
        if loc:
            ax.plot([x for x, _ in loc], [y for _, y in loc], "o-", color=COLORS["local"], label="all local")
        for j, b in enumerate(budgets):
            for peer in CURVE_PEERS:
                pts = sorted((r["size_mib"], r[f"{t}_rps"]) for r in rows if r["peer"] == peer and
                             r.get("budget_mib") == b and r.get(f"{t}_rps") and r.get("curve"))
                if pts:
                    ax.plot([x for x, _ in pts], [y for _, y in pts], "o" + styles[j % len(styles)],
                            color=COLORS[peer], label=f"{peer}, {human(b * MIB)} local")
            ax.axvline(b, color="#999999", linestyle=styles[j % len(styles)], linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({r["size_mib"] for r in rows if r.get("curve")} | set(budgets))
        ax.set_xticks(sizes)
        ax.set_xticklabels([human(s * MIB) for s in sizes])
        ax.set_xlabel("dataset (used_memory target); vertical lines: local budgets")
        ax.set_ylabel(f"{t.upper()} requests/s")
        ax.set_title(f"{t.upper()} throughput vs dataset size (uniform random keys)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


COLUMNS = [
    Column("size", "dataset"),
    Column("budget", "local"),
    Column("peer", "peer"),
    Column("keys", "keys", "{:,}"),
    Column("used_memory_mib", "used MiB", "{:,.0f}"),
    Column("fill_mb_per_s", "fill MB/s", "{:,.0f}"),
    Column("get_rps", "GET/s", "{:,.0f}"),
    Column("get_x_local", "x local", "{:.3f}"),
    Column("get_x_swap", "x swap", "{:.2f}"),
    Column("get_p99_ms", "GET p99 ms", "{:.2f}"),
    Column("set_rps", "SET/s", "{:,.0f}"),
    Column("set_x_local", "x local", "{:.3f}"),
    Column("set_x_swap", "x swap", "{:.2f}"),
    Column("vmhwm", "peak RSS MiB", "{:,}"),
    Column("store_faults", "store faults", "{:,}"),
    Column("pswpin", "swap-ins", "{:,}"),
    Column("cache_growth_mib", "cache+ MiB", "{:,}"),
    Column("cpu_psi_pct", "cpu wait%", "{:.0f}"),
    Column("ok", "ok"),
    Column("note", "note"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes: a few minutes")
    ap.add_argument("--budgets", help="local budgets of the curve, e.g. 256M,512M")
    ap.add_argument("--sizes", help="dataset sizes of the curve, e.g. 256M,512M,1G,2G")
    ap.add_argument("--headline", help="SIZE@BUDGET, e.g. 1G@256M (all four peers)")
    ap.add_argument("--peers", help="subset of " + ",".join(PEERS))
    ap.add_argument("--value", type=int, default=1024, help="value bytes")
    ap.add_argument("--get-n", type=int, help="timed GET requests per run")
    ap.add_argument("--set-n", type=int, help="timed SET requests per run")
    ap.add_argument("--slack-mib", type=int, default=16,
                    help="swap-disk cgroup limit = budget + this + size/512: what redis holds outside "
                         "its jemalloc heap (an empty redis-server has ~3 MiB anonymous) and its page "
                         "tables; memlend's --local does not count those either")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per redis-benchmark run, at most")
    ap.add_argument("--wait-quiet", type=float, default=5, metavar="S",
                    help="before each run wait up to S s for the CPUs to be >= 80%% idle (0: don't)")
    ap.add_argument("--force", action="store_true", help="run even if another benchmark is running")
    ap.add_argument("--name", default="app_redis")
    a = ap.parse_args()
    if a.quick:
        budgets, sizes, headline, get_n, set_n = ["64M", "128M"], ["128M", "256M", "512M"], "256M@64M", 100_000, 50_000
    else:
        budgets, sizes, headline, get_n, set_n = ["256M", "512M"], ["256M", "512M", "1G", "2G"], "1G@256M", 200_000, \
            100_000
    budgets = [parse_size(b) for b in (a.budgets.split(",") if a.budgets else budgets)]
    sizes = [parse_size(s) for s in (a.sizes.split(",") if a.sizes else sizes)]
    hs, hb = (parse_size(x) for x in (a.headline or headline).split("@"))
    a.get_n, a.set_n = a.get_n or get_n, a.set_n or set_n
    peers = a.peers.split(",") if a.peers else PEERS
    for p in peers:
        if p not in PEERS:
            raise SystemExit(f"unknown peer {p}; peers are {', '.join(PEERS)}")
    if "local" not in peers:
        peers = ["local"] + peers  # every ratio needs it
    for tool in ("redis-server", "redis-benchmark"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is missing: apt-get install redis-server redis-tools")

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)
    workdir = tempfile.mkdtemp(prefix="app_redis.", dir="/var/tmp")  # a real disk, not tmpfs
    UNDO.push(f"rm -r {workdir}", lambda: shutil.rmtree(workdir, ignore_errors=True))
    atexit.register(UNDO.run)  # a last resort; the finally below normally empties it
    t_start = time.time()
    rows, skips, stamps, cal, busy = [], {}, {}, {}, None
    machine = Machine(workdir)
    machine.cg = os.path.join(CG_ROOT, f"app_redis_{os.getpid()}")
    try:
        busy = other_benchmarks()
        if busy:
            if not a.force:
                raise SystemExit(f"another benchmark is running, and 2 cores shared make both wrong; try "
                                 f"again when it is done (or --force):\n{busy}")
            log(f"WARNING: another benchmark is running; the numbers will be disturbed:\n{busy}")
        machine.preflight("swap-disk" in peers, False)
        skips["swap-disk"] = machine.swap_skip
        why, binp, stamps = snapshot_memlend(workdir)
        if why:
            skips["memlend-donor"] = skips["memlend-ssd"] = why
        for k, v in skips.items():
            if v and k in peers:
                log(f"{k}: skipped: {v}")
        skips = {k: v for k, v in skips.items() if v and k in peers}
        skips.update({p: "not selected" for p in PEERS if p not in peers})
        per_key, empty_used, empty_rss = calibrate(workdir, a.value)
        cal = {"used_memory_per_key": round(per_key, 1), "empty_used_memory": empty_used, "empty_rss_mib": empty_rss}
        log(f"calibration: used_memory {per_key:.0f} B per key of {a.value} B; empty redis-server RSS "
            f"{empty_rss:.1f} MiB")
        env = {"machine": machine, "workdir": workdir, "bin": binp, "skips": skips}

        def keys_for(size):
            return int((size - empty_used) / per_key)

        # the cells: every (size, budget) of the curve with the curve peers, the headline
        # with every peer; all-local once per size
        cells = {}
        for size in sorted(set(sizes) | {hs}):
            for b in budgets:
                if size in sizes:
                    cells.setdefault((size, b), set()).update(p for p in CURVE_PEERS if p in peers)
            if size == hs:
                cells.setdefault((size, hb), set()).update(p for p in peers if p != "local")
        n_cell = 0
        for size in sorted({s for s, _ in cells}):
            keys = keys_for(size)
            log(f"== {human(size)} ({keys:,} keys of {a.value} B): local")
            row = run_one("local", size, size, keys, a, env)
            row["curve"], row["headline"] = size in sizes, size == hs
            rows.append(row)
            log("   ", json.dumps({k: row.get(k) for k in ("get_rps", "set_rps", "used_memory_mib", "ok", "note")}))
            for b in sorted(b for s, b in cells if s == size):
                far = [p for p in PEERS if p in cells[(size, b)]]
                k = n_cell % max(1, len(far))
                n_cell += 1
                for peer in far[k:] + far[:k]:
                    log(f"== {human(size)} at {human(b)} local: {peer}")
                    row = run_one(peer, size, b, keys, a, env)
                    row["curve"] = size in sizes and b in budgets and peer in CURVE_PEERS
                    row["headline"] = (size, b) == (hs, hb)
                    rows.append(row)
                    log("   ", json.dumps({k: row.get(k) for k in ("get_rps", "set_rps", "store_faults", "pswpin",
                                                                 "vmhwm", "ok", "note")}))
    finally:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # let the cleanup finish
            signal.signal(s, signal.SIG_IGN)
        UNDO.run()
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_DFL)
        if machine.swapfile in active_swaps():
            print(f"WARNING: {machine.swapfile} still active after cleanup", file=sys.stderr)
        if os.path.isdir(machine.cg):
            print(f"WARNING: {machine.cg} still there after cleanup", file=sys.stderr)
    add_ratios(rows)
    order = {p: i for i, p in enumerate(PEERS)}
    rows.sort(key=lambda r: (r["size_mib"], r["budget_mib"] or 0, order[r["peer"]]))
    meta = {
        "budgets": [human(b) for b in budgets], "sizes": [human(s) for s in sizes],
        "headline": f"{human(hs)}@{human(hb)}", "peers": peers, "value_bytes": a.value, "get_n": a.get_n,
        "set_n": a.set_n, "pipeline": 16, "clients": 8, "key_distribution": "uniform (redis-benchmark -r)",
        "slack_mib": a.slack_mib, "calibration": cal, "other_benchmark_running_at_start": busy, "skips": skips, "wait_quiet_s": a.wait_quiet,
        "page_cluster": machine.page_cluster, "zswap_was": machine.zswap0,
        "thp": read("/sys/kernel/mm/transparent_hugepage/enabled"), "nproc": os.cpu_count(),
        "kernel": os.uname().release, "wall_s": round(time.time() - t_start),
        "redis": subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip(),
        "git_head": sh(["git", "-C", common.ROOT, "rev-parse", "--short", "HEAD"], check=False).stdout.strip(),
        "memlend_build_mtimes": stamps,
    }
    title = (f"app_redis: redis-server, {a.value} B values, uniform random keys; GET -n {a.get_n:,}, "
             f"SET -n {a.set_n:,}, -P 16 -c 8; x local / x swap = throughput over all-local / swap-disk "
             f"of the same dataset and budget")
    print()
    report(a.name, rows, COLUMNS, meta=meta, title=title)
    png = os.path.join(common.RESULTS, a.name + ".png")
    plot(png, rows, (hs, hb), title)
    print("wrote", os.path.relpath(png))
    print(f"\nheadline: {human(hs)} dataset, {human(hb)} local budget ({hs / hb:g}x):")
    for r in rows:
        if r.get("headline"):
            def f(t):
                if not r.get(f"{t}_rps"):
                    return f"{t.upper()} -"
                return (f"{t.upper()} {r[f'{t}_rps']:>10,.0f}/s  {r.get(f'{t}_x_local', 0):.3f}x local" +
                        (f"  {r[f'{t}_x_swap']:.2f}x swap" if r.get(f"{t}_x_swap") else ""))
            print(f"  {r['peer']:<14} {f('get')}   {f('set')}" + (f"   ({r['note']})" if r.get("note") else ""))
    bad = [r for r in rows if r.get("ok") is False]
    if bad:
        print(f"{len(bad)} run(s) FAILED a check: " + "; ".join(f"{r['peer']} {r['size']}@{r['budget']}: "
                                                              f"{r.get('note')}" for r in bad))
        sys.exit(1)


if __name__ == "__main__":
    main()
