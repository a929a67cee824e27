#!/usr/bin/python3
"""Batch jobs over a skewed working set, each peer in the SAME memory cgroup with the SAME total
memory: the numpy analytics job (bench/jobs/numpy_table.py), SQLite with a skewed query mix
(bench/jobs/sqlite_kv.py), and a key-value job on a JVM (bench/jobs/jvm) and in Go linked with cgo
(bench/jobs/gokv), the application kinds bench/apps.py's servers do not cover.

    sudo /usr/bin/python3 bench/jobs.py                 # 512 MiB, fractions 25,50,75
         [--jobs numpy,sqlite,jvm,go] [--size 512M] [--fractions 25,50,75] [--seconds 20]
         [--warm-seconds 20] [--peers local,swap-disk,zswap,zram,memlend-donor,...]
         [--memlend-args "..."] [--memlend-variant NAME=ARGS ...] [--name jobs]

Each job is one process (/usr/bin/python3) that builds its data (untimed, inside the limit),
warms up, runs a timed phase and verifies every byte it can (see each job's docstring); it
prints ops/s (rows for numpy, queries for SQLite) and per-operation latency. LIMIT = fraction
of the all-local job's memcg peak (measured first, in the same run). The peers and their setup
are bench/apps.py's (Bench.peer_env): swap to a disk swapfile, zswap (lz4), zram (its pool
counted in the same LIMIT), `memlend run --mem LIMIT` over a loopback donor (SQLite also gets
--threshold 64K: its page cache is one malloc of ~64 KiB per 64 KiB database page, under
memlend's default 1 MiB threshold), and memlend variants. Peers rotate from cell to cell.
Prints the table; writes bench/results/NAME.json and NAME.png. The machine is left as found
(far_micro's undo stack: swap off, zram reset, zswap restored, the cgroup removed)."""

import argparse
import atexit
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import apps  # noqa: E402
import common  # noqa: E402
from app_redis import Proc, memlend_summary, snapshot_memlend  # noqa: E402
from far_micro import (CG_ROOT, MIB, UNDO, ZSWAP, Machine, active_swaps, human, log, on_signal,  # noqa: E402
                       parse_size, sh)
from report import report  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"  # the interpreter with numpy (scripts/setup.sh installs python3-numpy)
JOBS = {
    "numpy": {"script": "numpy_table.py", "mix": "95/5", "memlend_args": ""},
    "sqlite": {"script": "sqlite_kv.py", "mix": "95/5", "memlend_args": "--threshold 64K"},
    # A JVM (its heap a PROT_NONE reservation, committed with MAP_FIXED) and a Go program linked
    # with cgo (arenas reserved the same way), the same key-value work (bench/jobs/jvm,
    # bench/jobs/gokv). --far is the region's (virtual) size, and the donor lends it (apps.Bench.far):
    # a reservation is far only if the region has room for it when it is made. A JVM reserves its
    # heap (-Xmx, job_argv), a 240 MiB code cache and a 1 GiB class space at start; Go reserves
    # ~1.1 GiB of sparse index (1, 8, 64 and two 512 MiB PROT_NONE ranges) before its first arena.
    "jvm": {"build": "jvm", "mix": "95/5", "memlend_args": "--far 3G"},
    "go": {"build": "go", "mix": "95/5", "memlend_args": "--far 3G"},
    # PostgreSQL (bench/jobs/pg_job.py): its shared buffers hold the data, one shared anonymous
    # mapping that memlend serves across the postmaster and its backends. --threshold 64M keeps
    # every process's own memory local (it is small), so the row measures the shared buffers.
    "pg-select": {"script": "pg_job.py", "args": ["--mix", "select"], "mix": "select-only zipf",
                  "memlend_args": "--threshold 64M --far 256M"},
    "pg-tpcb": {"script": "pg_job.py", "args": ["--mix", "tpcb"], "mix": "TPC-B-like",
                "memlend_args": "--threshold 64M --far 256M"},
}
# Where the built JVM and Go jobs are (build_jobs fills it).
BUILT = {}


def build_jobs(jobs, workdir):
    """Compile the JVM and Go jobs into `workdir`, once, before any run."""
    if "jvm" in jobs:
        out = os.path.join(workdir, "jvm")
        os.makedirs(out, exist_ok=True)
        sh(["javac", "-d", out, os.path.join(HERE, "jobs", "jvm", "KvJob.java")])
        BUILT["jvm"] = out
    if "go" in jobs:
        out = os.path.join(workdir, "gokv")
        go = shutil.which("go") or "/usr/local/go/bin/go"
        env = dict(os.environ, CGO_ENABLED="1", GOCACHE=os.path.join(workdir, "gocache"))
        subprocess.run([go, "build", "-o", out, "."], cwd=os.path.join(HERE, "jobs", "gokv"), env=env, check=True)
        BUILT["go"] = out
COLUMNS = [c for c in apps.COLUMNS if c.key not in ("timed_pswpin", "x_2x_threads")]


def job_argv(job, a):
    args = ["--size", str(a.size), "--seconds", str(a.seconds), "--warm-seconds", str(a.warm_seconds),
            "--seed", str(a.seed)]
    if job == "jvm":
        # The heap holds the records (4 KiB each plus a header) with room for the collector.
        heap_mib = a.size * 3 // 2 // MIB + 256
        return ["java", f"-Xmx{heap_mib}m", "-cp", BUILT["jvm"], "KvJob"] + args
    if job == "go":
        return [BUILT["go"]] + args
    return [PY, os.path.join(HERE, "jobs", JOBS[job]["script"])] + args + JOBS[job].get("args", [])


def last_json(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


# Swap's side of a miss, counted over a whole run: pages read in, faults that waited for a
# read (major), and readahead: pages read beside a fault, and faults those pages served.
VMSTAT_WHOLE = ("pswpin", "pgmajfault", "swap_ra", "swap_ra_hit")


def vmstat_whole():
    out = dict.fromkeys(VMSTAT_WHOLE, 0)
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k in out:
                out[k] = int(v)
    return out


def run(bench, job, peer, frac, limit):
    a, m = bench.a, bench.machine
    row = {"app": job, "mix": JOBS[job]["mix"], "peer": peer, "frac_pct": frac,
           "limit_mib": None if peer == "local" else limit // MIB, "size_mib": a.size // MIB}
    if bench.skips.get(peer):
        row["note"] = "skipped: " + bench.skips[peer]
        return row
    if peer in apps.SWAP_PEERS and active_swaps():
        row["note"] = f"skipped: swap this run did not create is active ({', '.join(active_swaps())})"
        return row
    bench.a.memlend_args = (a.base_memlend_args + " " + JOBS[job]["memlend_args"]).strip()
    tag = f"{job}_{peer}_{frac or 'all'}"
    errors, proc, sampler = [], None, None
    t0 = time.time()
    try:
        with bench.peer_env(peer, limit, tag, row) as (cg_limit, wrap):
            argv = wrap(job_argv(job, a))
            m.set_limit(cg_limit)
            bench._empty_cg()
            row["cg_limit_mib"] = None if cg_limit < 0 else cg_limit // MIB
            if a.wait_quiet:
                row["idle_before_pct"] = round(common.wait_quiet(a.wait_quiet, 80), 1)
            log("  +", " ".join(shlex.quote(x) for x in argv) +
                (f"   (memcg limit {row['cg_limit_mib']} MiB)" if cg_limit >= 0 else ""))
            holder = {}

            def stall_kill():  # zram full at its mem_limit: the job would crawl until the timeout
                if holder.get("proc") is not None and holder["proc"].poll() is None:
                    os.killpg(holder["proc"].proc.pid, signal.SIGKILL)

            sampler = apps.Sampler(stall_kill if peer == "zram" else None)
            psi0, vm0 = common.cpu_psi_total_us(), vmstat_whole()
            proc = holder["proc"] = Proc(argv, os.path.join(bench.workdir, f"{tag}.log"), m.cg)
            if proc.wait(a.timeout) is None:
                errors.append(f"did not finish within {a.timeout:.0f} s")
            psi1, vm1 = common.cpu_psi_total_us(), vmstat_whole()
            proc.kill(signal.SIGKILL)
            # Over the whole run (build, warm-up and timed phase alike), for every peer.
            row.update({f"run_{k}": vm1[k] - vm0[k] for k in VMSTAT_WHOLE})
            out = proc.output()
            res = last_json(out) or {}
            for k in ("ops", "seconds", "ops_per_s", "p50_us", "p99_us", "p999_us", "unit", "verified", "rows",
                      "build_s", "load_s", "lat_avg_us"):
                row[k] = res.get(k)
            if psi0 is not None and psi1 is not None:
                row["cpu_psi_pct"] = round((psi1 - psi0) / 1e6 / (time.time() - t0) * 100, 1)  # whole run
            if not res:
                errors.append(f"no result (exit {proc.returncode})")
            elif not res.get("verified"):
                errors.append("verification failed: " + "; ".join(res.get("errors") or []))
            if peer.startswith("memlend") or peer in bench.variants:
                row.update(memlend_summary(out))
            if errors:
                row["log_tail"] = out[-1500:]
            if peer == "zram":
                z = apps.zram_mm_stat()
                if z:
                    row["zram_mem_used_max_mib"] = round(z["used_max"] / MIB, 1)
                    if z["compr"]:
                        row["zram_ratio"] = round(z["orig"] / z["compr"], 2)
            pk = sampler.stop()
            if sampler.stalled:
                errors.insert(0, f"zram full at its mem_limit ({row.get('zram_share_mib')} MiB): "
                                 f"{sampler.stalled:,} failed swap-outs, the job stalled and was killed")
            sampler = None
            if peer == "zswap":
                row["zswap_pool_peak_mib"] = round(pk["zswap_pool_kib"] / 1024, 1)
            row.update(m.cg_stats())
            kmem = apps.cg_read(m, "memory.kmem.max_usage_in_bytes")
            if kmem is not None:
                row["cg_kmem_max_usage_mib"] = round(kmem / MIB, 1)
    except apps.Skip as why:
        row["note"] = f"skipped: {why}"
        return row
    except Exception as e:  # one failed run does not end the benchmark
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        if sampler is not None:
            sampler.stop()
        if proc is not None:
            proc.kill(signal.SIGKILL)
    apps.add_total(row)
    row["wall_s"] = round(time.time() - t0, 1)
    notes = []
    if row.get("cg_oom_kills"):
        notes.append(f"OOM-killed ({row['cg_oom_kills']} kill(s) by the memcg, limit {row.get('cg_limit_mib')} MiB)")
    notes += errors
    foreign = sorted({x.split(":")[0] for x in apps.foreign_procs()})
    if foreign:
        notes.append("not ours, running too: " + ",".join(foreign))
    row["ok"] = not errors and not row.get("cg_oom_kills")
    if notes:
        row["note"] = "; ".join(notes)[:400]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="numpy,sqlite")
    ap.add_argument("--size", default="512M", help="the job's data")
    ap.add_argument("--fractions", default="25,50,75", help="memory for the limited peers, %% of all-local usage")
    ap.add_argument("--peers", help="subset of " + ",".join(apps.BASE_PEERS[:-1]) + " and the variant names")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warm-seconds", type=float, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900, help="a run's bound, s")
    ap.add_argument("--zram-share", type=float, default=0.5,
                    help="zram's mem_limit: a fraction of LIMIT (< 1) or bytes; the memcg gets the rest")
    ap.add_argument("--memlend-args", default="", help="appended to every `memlend run`")
    ap.add_argument("--memlend-variant", action="append", default=[], metavar="NAME=ARGS")
    ap.add_argument("--donor-variant", action="append", default=[], metavar="PEER=ARGS",
                    help="extra memlendd arguments for one memlend peer")
    ap.add_argument("--page-cluster-compressed", default="0", metavar="N|asis")
    ap.add_argument("--page-cluster-disk", default="asis", metavar="N|asis")
    ap.add_argument("--wait-quiet", type=float, default=5, metavar="S")
    ap.add_argument("--split-cpus", action="store_true",
                    help="every peer's job and memlend's own threads on CPU 0 only, memlend's donor on CPU 1 "
                    "only: the donor as another machine would be (as bench/apps.py --split-cpus)")
    ap.add_argument("--name", default="jobs")
    a = ap.parse_args()
    if a.split_cpus:
        # Every child inherits CPU 0; the donor alone is moved to CPU 1 (apps.Bench.donor_prefix).
        os.sched_setaffinity(0, {0})
    a.size = parse_size(a.size)
    a.base_memlend_args = a.memlend_args
    fracs = [int(f) for f in a.fractions.split(",")]
    jobs = a.jobs.split(",")
    for j in jobs:
        if j not in JOBS:
            raise SystemExit(f"unknown job {j}; jobs are {', '.join(JOBS)}")
    variants = dict(v.partition("=")[::2] for v in a.memlend_variant)
    all_peers = [p for p in apps.BASE_PEERS if p != apps.AT_ZSWAP_TOTAL] + list(variants)
    peers = a.peers.split(",") if a.peers else all_peers
    for p in peers:
        if p not in all_peers:
            raise SystemExit(f"unknown peer {p}; peers are {', '.join(all_peers)}")
    peers = ["local"] + [p for p in peers if p != "local"]

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)
    workdir = tempfile.mkdtemp(prefix="jobs.", dir="/var/tmp")
    # Every user may pass through it: the PostgreSQL jobs run their server as `postgres`, whose
    # processes load the shim from workdir/bin (unreadable, ld.so skips it without a word to us).
    os.chmod(workdir, 0o755)
    UNDO.push(f"rm -r {workdir}", lambda: shutil.rmtree(workdir, ignore_errors=True))
    atexit.register(UNDO.run)
    t_start = time.time()
    rows, skips, floors = [], {}, {}
    machine = Machine(workdir)
    machine.cg = os.path.join(CG_ROOT, f"jobs_{os.getpid()}")
    try:
        machine.preflight(True, "zram" in peers)
        if machine.swap_skip and ("root" in machine.swap_skip or "no cgroup" in machine.swap_skip):
            raise SystemExit(f"cannot run: {machine.swap_skip} (every peer runs in a memory cgroup)")
        skips.update({"swap-disk": machine.swap_skip, "zswap": machine.swap_skip, "zram": machine.zram_skip})
        if not os.path.exists(ZSWAP):
            skips["zswap"] = "no zswap in this kernel"
        why, binp, _ = snapshot_memlend(workdir)
        if why:
            skips.update({p: why for p in ["memlend-donor"] + list(variants)})
        skips = {k: v for k, v in skips.items() if v and k in peers}
        machine.cgroup()
        build_jobs(jobs, workdir)
        bench = apps.Bench(a, machine, workdir, None, binp, skips, variants, True)
        floors = common.measure_floors(a.wait_quiet)
        log(common.fmt_floors(floors))
        n_cell = 0
        for job in jobs:
            log(f"== {job}: local")
            row = run(bench, job, "local", None, None)
            rows.append(row)
            log("   ", json.dumps({k: row.get(k) for k in ("ops_per_s", "p50_us", "p99_us", "cg_max_usage_mib", "ok",
                                                         "note")}))
            if not row.get("ok") or not row.get("cg_max_usage_mib"):
                log(f"   the all-local {job} run failed, so LIMIT has no base: {row.get('note')}")
                continue
            base = int(row["cg_max_usage_mib"] * MIB)
            others = peers[1:]
            for f in fracs:
                limit = base * f // 100 // MIB * MIB
                k = n_cell % max(1, len(others))
                n_cell += 1
                for peer in others[k:] + others[:k]:
                    log(f"== {job} {f}% ({limit // MIB} MiB): {peer}")
                    row = run(bench, job, peer, f, limit)
                    rows.append(row)
                    log("   ", json.dumps({k: row.get(k) for k in ("ops_per_s", "p50_us", "p99_us", "cg_max_usage_mib",
                                                                 "total_peak_mib", "store_faults", "ok", "note")}))
    finally:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
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
    apps.add_ratios(rows)
    floor = floors.get("floor_same_p50_us")
    for r in rows:
        if r.get("fault_p50_us") and floor:
            r["fault_p50_x_floor"] = round(r["fault_p50_us"] / floor, 2)
    order = {p: i for i, p in enumerate(peers)}
    rows.sort(key=lambda r: (jobs.index(r["app"]), r["frac_pct"] or 0, order[r["peer"]]))
    meta = {"jobs": jobs, "size_mib": a.size // MIB, "fractions_pct": fracs, "peers": peers,
            "memlend_variants": variants, "donor_variants": a.donor_variant, "memlend_args": a.base_memlend_args,
            "job_memlend_args": {j: JOBS[j]["memlend_args"] for j in jobs}, "seconds": a.seconds,
            "warm_seconds": a.warm_seconds, "seed": a.seed, "split_cpus": a.split_cpus, "zram_share": a.zram_share, "skips": skips,
            "nproc": os.cpu_count(), "kernel": os.uname().release, "wall_s": round(time.time() - t_start),
            "git_head": sh(["git", "-C", common.ROOT, "rev-parse", "--short", "HEAD"], check=False).stdout.strip(),
            "floors": floors}
    title = (f"jobs: {', '.join(jobs)}, {human(a.size)} of data, zipf 0.99 (YCSB scrambled), {a.seconds:g} s "
             f"timed; every limited peer: total memory = mem% of all-local usage, in one memcg")
    print()
    report(a.name, rows, COLUMNS, meta=meta, title=title)
    print(common.fmt_floors(floors))
    png = os.path.join(common.RESULTS, a.name + ".png")
    apps.plot(png, rows, peers, title, jobs)
    print("wrote", os.path.relpath(png))
    print(f"wall time: {meta['wall_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
