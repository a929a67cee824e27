#!/usr/bin/python3
"""Native page-protocol benchmark: pages/s and latency for 1 and 4
connections with 1 and 32 requests in flight, reads and writes, plus 16-page
requests; and, in the same run, the loopback floors it is judged against
(TCP request/response with the same sizes, and TCP stream bandwidth).

Starts its own memlendd and stops it on every exit path. Writes
bench/results/proto.json and bench/results/proto.png.

usage: bench/proto.py [--secs S] [--quick]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from report import Bars, Column, report  # noqa: E402

PAGES_PER_S_AT_TCP_STREAM = lambda gbit: gbit * 1e9 / 8 / 4096  # noqa: E731


def floors(secs):
    nb = common.build_floor_tool("net_bench")
    if nb is None:
        return {}
    out = {}
    rr = subprocess.run([nb, "rr", "tcp", "48", "4136", "50000", "1", "none"],
                        capture_output=True, text=True, check=True).stdout
    out["tcp_rr_4k_p50_us"] = common.grab(rr, r"p50=([\d.]+)us")
    out["tcp_rr_4k_ops_per_s"] = common.grab(rr, r"(\d+) ops/s")
    st = subprocess.run([nb, "stream", "tcp", "131072", str(int(max(2, secs))), "none"],
                        capture_output=True, text=True, check=True).stdout
    out["tcp_stream_gbit_per_s"] = common.grab(st, r"([\d.]+) Gbit/s")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=float, default=5.0)
    ap.add_argument("--quick", action="store_true", help="fewer points, 2 s each")
    a = ap.parse_args()
    secs = 2.0 if a.quick else a.secs
    port = common.free_port()
    donor = f"127.0.0.1:{port}"
    points = [(op, c, d, 1) for op in ("read", "write") for c in (1, 4) for d in (1, 32)]
    points += [("read", 4, 32, 16), ("write", 4, 32, 16)]
    if a.quick:
        points = [p for p in points if p[2] == 32]
    rows = []
    load_before = os.getloadavg()[0]
    with common.Daemon(["--lend", "3G", "--listen", donor, "--insecure"]):
        for op, conns, depth, ppr in points:
            cmd = [common.bin_path("memlend"), "bench", "--insecure", "--donor", donor,
                   "--op", op, "--conns", str(conns), "--depth", str(depth),
                   "--pages-per-req", str(ppr), "--slab", "128M", "--secs", str(secs), "--json"]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed: {run.stderr.strip()}")
            r = json.loads(run.stdout)
            rows.append(r)
    fl = floors(secs)
    stream_pages = PAGES_PER_S_AT_TCP_STREAM(fl["tcp_stream_gbit_per_s"]) if fl else None
    for r in rows:
        r["point"] = f"{r['op']} {r['conns']}x{r['depth']} {r['pages_per_req']}p"
        r["vs_tcp_stream"] = r["pages_per_s"] / stream_pages if stream_pages else None
    notes, hlines = [], []
    if fl:
        notes.append(f"TCP stream floor, same run: {stream_pages / 1e3:.0f} K pages/s "
                     f"({fl['tcp_stream_gbit_per_s']} Gbit/s); TCP 4 KiB request-reply p50 "
                     f"{fl['tcp_rr_4k_p50_us']} us")
        hlines.append((stream_pages, "TCP stream floor (same run)"))
    report(
        "proto", rows, COLUMNS,
        plots=[Bars(x="point", series=[("pages_per_s", "memlend page protocol")],
                    ylabel="pages/s", title="4 KiB pages over TCP loopback "
                    "(op conns x depth, pages per request)", hlines=hlines)],
        meta={"secs": secs, "load_avg_1m_start": load_before, "floors": fl},
        title="page protocol over TCP loopback",
    )
    for n in notes:
        print(n)
    qd1 = [r for r in rows if r["op"] == "read" and r["conns"] == 1 and r["depth"] == 1]
    if fl and qd1:
        print(f"read QD1 p50 / TCP request-reply p50 = "
              f"{qd1[0]['latency_us_p50'] / fl['tcp_rr_4k_p50_us']:.2f}")
    print(f"load average at start: {load_before:.2f}")


COLUMNS = [
    Column("point", "point"),
    Column("pages_per_s", "pages/s", "{:,.0f}"),
    Column("gbit_per_s", "Gbit/s", "{:.2f}"),
    Column("latency_us_p50", "p50 us", "{:.1f}"),
    Column("latency_us_p99", "p99 us", "{:.1f}"),
    Column("vs_tcp_stream", "vs TCP stream", "{:.2f}"),
]


if __name__ == "__main__":
    main()
