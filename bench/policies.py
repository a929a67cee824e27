#!/usr/bin/env python3
"""Eviction policies on a real page-access trace, against Belady's optimum.

    /usr/bin/python3 bench/policies.py [--size 768M] [--mixes read-only=100,50/50=50]
                                       [--seconds 120] [--cache 10%,25%,50%,75%]

For each mix: a loopback donor; redis-server (or memcached with four workers: `--app
memcached`) under `memlend run --trace DIR` (the tracing mode keeps 1 MiB of far pages mapped, so nearly every access to a page outside the last 256
touched faults and is recorded); YCSB-style load of --size of 1 KiB text records
(bench/ycsb_load.c, as apps.py); --seconds of zipfian (0.99) operations. Then
`memlend replay` runs the trace through FIFO, the handler's S3-FIFO as it runs live (it sees
only misses and the first write to a page mapped write-protected: "s3fifo-blind"), the same
S3-FIFO seeing every access, CLOCK, LRU, ARC and OPT (Belady). Misses are counted over the
last two thirds of the operations (the load and the first third warm the cache). Cache sizes
are shares of the distinct pages the trace touches: 25% is apps.py's 25%-of-memory case.

Prints the table; writes results/policies.json and results/policies.png.
"""
import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from report import Bars, Column, plot, report  # noqa: E402

MIB = 1 << 20
RECORD_BYTES = 1389  # memcg bytes per 1 KiB record in redis, as apps.py measures


def parse_size(s):
    units = {"K": 1 << 10, "M": MIB, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def build_ycsb(workdir):
    out = os.path.join(workdir, "ycsb_load")
    src = os.path.join(common.ROOT, "bench", "ycsb_load.c")
    subprocess.run(["gcc", "-O2", "-pthread", "-o", out, src, "-lm"], check=True)
    return out


# memcg bytes per 1 KiB record, as apps.py measures them
RECORD_BYTES_BY_APP = {"redis": RECORD_BYTES, "memcached": 1222}


def ycsb(tool, port, records, extra, timeout_s, app="redis"):
    argv = [tool, "--proto", app, "--port", str(port), "--records", str(records),
            "--value-size", "1024", "--values", "text", "--zipf", "0.99", "--seed", "1"] + extra
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"ycsb_load failed ({out.returncode}): {out.stderr[-400:]}")
    res = json.loads(lines[-1])
    if res.get("errors") or res.get("bad_values") or res.get("misses"):
        raise RuntimeError(f"ycsb_load saw bad answers: {res}")
    return res


def wait_server(app, port, proc, timeout_s=60):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{app} under memlend exited {proc.returncode}")
        if app == "redis":
            ok = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
            if ok.stdout.strip() == "PONG":
                return
        else:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        time.sleep(0.2)
    raise RuntimeError(f"{app} did not come up")


def server_argv(app, port, workdir, size):
    if app == "redis":
        return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                "no", "--dir", workdir]
    # as apps.py runs it: four workers, room for every record (no eviction), one user
    return ["memcached", "-u", "root", "-l", "127.0.0.1", "-p", str(port), "-U", "0",
            "-m", str(2 * size // MIB + 256), "-t", "4", "-c", "4096"]


def stop_server(app, port, server):
    if app == "redis":
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)
    else:
        server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.send_signal(signal.SIGKILL)
        server.wait()


def trace_entries(tdir):
    return sum(os.path.getsize(os.path.join(tdir, f)) for f in os.listdir(tdir)) // 4


def capture(a, tool, workdir, mix, read_pct):
    """Trace the app through load and operations; (trace path, entries after load, ops)."""
    records = a.size // RECORD_BYTES_BY_APP[a.app]
    tdir = os.path.join(workdir, f"trace-{read_pct}")
    os.makedirs(tdir)
    dport, port = common.free_port(), common.free_port()
    with common.Daemon(["--lend", "4G", "--listen", f"127.0.0.1:{dport}", "--insecure"]):
        argv = [common.bin_path("memlend"), "run", "--trace", tdir, "--local", "1M",
                "--far", f"{2 * a.size // MIB + 256}M", "--donor", f"127.0.0.1:{dport}",
                "--insecure", "-q", "--"] + server_argv(a.app, port, workdir, a.size)
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_server(a.app, port, server)
            print(f"== {mix}: loading {records:,} records under tracing", flush=True)
            ycsb(tool, port, records, ["--load", "--threads", "16"], 3600, a.app)
            time.sleep(0.5)
            loaded = trace_entries(tdir)
            print(f"   {loaded:,} accesses in the load; {a.seconds:.0f} s of operations", flush=True)
            ops = ycsb(tool, port, records, ["--threads", "16", "--read-pct", str(read_pct),
                                             "--seconds", str(a.seconds), "--seed", "2"],
                       a.seconds + 600, a.app)
        finally:
            stop_server(a.app, port, server)
    files = os.listdir(tdir)
    if len(files) != 1:
        raise RuntimeError(f"expected one trace in {tdir}, found {files}")
    return os.path.join(tdir, files[0]), loaded, ops


def replay(path, cache, warm_entries):
    total = os.path.getsize(path) // 4
    out = subprocess.run([common.bin_path("memlend"), "replay", path, "--cache", cache,
                          "--warm", f"{warm_entries / total:.6f}", "--json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["traces"][0]


def keep(d, mix, path, loaded, warm, ops):
    os.makedirs(d, exist_ok=True)
    stem = os.path.join(d, mix.replace("/", "-"))
    shutil.move(path, stem + ".trace")
    with open(stem + ".json", "w") as f:
        json.dump({"load_entries": loaded, "warm_entries": warm, "ops": ops}, f)
    print(f"   kept {stem}.trace", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", choices=sorted(RECORD_BYTES_BY_APP), default="redis",
                    help="the server traced (memcached: four workers, as apps.py runs it)")
    ap.add_argument("--size", default="768M", help="data loaded into the server (default 768M)")
    ap.add_argument("--mixes", default="read-only=100,50/50=50")
    ap.add_argument("--seconds", type=float, default=120.0, help="operations traced per mix")
    ap.add_argument("--cache", default="10%,25%,50%,75%")
    ap.add_argument("--name", default="policies")
    ap.add_argument("--keep-traces", metavar="DIR",
                    help="move each trace here (MIX.trace, with MIX.json: entries in the load, ops) "
                         "to replay again later, e.g. through crates/replay/examples/probe_window.rs")
    a = ap.parse_args()
    a.size = parse_size(a.size)
    server = "redis-server" if a.app == "redis" else "memcached"
    if shutil.which(server) is None:
        raise SystemExit(f"{server} is missing: apt-get install {server}")
    rows = []
    workdir = tempfile.mkdtemp(prefix="policies.", dir="/var/tmp")
    try:
        tool = build_ycsb(workdir)
        for spec in a.mixes.split(","):
            mix, pct = spec.split("=")
            path, loaded, ops = capture(a, tool, workdir, mix, int(pct))
            total = os.path.getsize(path) // 4
            warm = loaded + (total - loaded) // 3
            res = replay(path, a.cache, warm)
            if a.keep_traces:
                keep(a.keep_traces, mix, path, loaded, warm, ops)
            measured_ops = ops["ops"] * 2 / 3
            opt = {o["cache_pages"]: o["misses"] for o in res["outcomes"] if o["policy"] == "opt"}
            for o in res["outcomes"]:
                pct_cache = 100.0 * o["cache_pages"] / res["distinct_pages"]
                rows.append({
                    "mix": mix, "cache_pct": round(pct_cache), "cache_pages": o["cache_pages"],
                    "policy": o["policy"], "misses": o["misses"], "miss_ratio": o["miss_ratio"],
                    "misses_per_op": o["misses"] / max(1.0, measured_ops),
                    "x_opt": o["misses"] / max(1, opt[o["cache_pages"]]),
                    "accesses": o["accesses"], "trace_entries": total, "load_entries": loaded,
                    "distinct_pages": res["distinct_pages"], "traced_ops": ops["ops"],
                    "label": f"{mix} {round(pct_cache)}%",
                })
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    columns = [Column("mix", "mix"), Column("cache_pct", "cache %"), Column("cache_pages", "pages"),
               Column("policy", "policy"), Column("misses", "misses"),
               Column("miss_ratio", "miss ratio", "{:.4f}"), Column("misses_per_op", "misses/op", "{:.3f}"),
               Column("x_opt", "x opt", "{:.2f}")]
    groups = {}
    for r in rows:
        groups.setdefault(r["label"], {"label": r["label"]})[r["policy"]] = r["x_opt"]
    plot_rows = list(groups.values())
    policies = [p for p in ["fifo", "s3fifo-blind", "s3fifo", "clock", "lru", "arc"] if any(p in g for g in plot_rows)]
    report(a.name, rows, columns,
           meta={"app": a.app, "size_bytes": a.size, "seconds": a.seconds, "mixes": a.mixes, "cache": a.cache,
                 "window_pages": 256},
           title=f"policies: {a.app} {a.size // MIB} MiB, zipf 0.99, traced with memlend run --trace")
    png = os.path.join(common.RESULTS, a.name + ".png")
    plot(png, plot_rows, [Bars(x="label", series=[(p, p) for p in policies], ylabel="misses / OPT's",
                               title=f"misses against Belady's optimum ({a.app}, zipf 0.99)",
                               hlines=[(1.0, "opt")])])
    print("wrote", os.path.relpath(png))

if __name__ == "__main__":
    main()
