#!/usr/bin/env python3
"""What safety costs: `memlend far` over loopback donors, in the same run,
with pages
  plain      on one donor, in clear (--no-encrypt): the baseline
  encrypted  on one donor, AES-256-GCM per page (the default)
  mirror     on two donors, encrypted (--redundancy mirror)
  ssd        on one donor and written through to an SSD file, encrypted
             (--redundancy ssd)
  erasure    Reed-Solomon 2+1 over three donors, encrypted
             (--redundancy erasure)
Each mode runs ROUNDS times, the modes alternating so that drift on this
shared machine hits all alike; the median of each rate is kept and reported
as a ratio to `plain` measured in the same run. The goal for encryption is a
cost under 10%.

Prints a table; writes bench/results/reliability_cost.{json,png}.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Daemon, bin_path, free_port, grab, wait_quiet  # noqa: E402
from report import Bars, Column, report  # noqa: E402

MODES = {
    "plain": ["--no-encrypt"],
    "encrypted": [],
    "mirror": ["--redundancy", "mirror"],
    "ssd": ["--redundancy", "ssd"],
    "erasure": ["--redundancy", "erasure"],
}
RATES = [("write", r"write every page\s+(\d+) pages/s"),
         ("random", r"random touches \(verify\)\s*(\d+) pages/s"),
         ("read", r"read every page \(verify\)\s*(\d+) pages/s")]


def far(donors, mode, a, ssd_dir):
    cmd = [bin_path("memlend"), "far", "--insecure", "--donor", donors[0]]
    if mode == "mirror":
        cmd += ["--also", donors[1]]
    if mode == "erasure":
        cmd += ["--also", donors[1], "--also", donors[2]]
    cmd += ["--size", a.size, "--local", a.local] + MODES[mode]
    if mode == "ssd":
        cmd += ["--ssd", ssd_dir]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{mode}: memlend far failed:\n{out.stdout}\n{out.stderr}")
    return {name: float(grab(out.stdout, pat)) for name, pat in RATES}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="512M")
    p.add_argument("--local", default="64M")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    idle = wait_quiet()
    ports = [free_port(), free_port(), free_port()]
    donors = [f"127.0.0.1:{port}" for port in ports]
    runs = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as ssd_dir, \
            Daemon(["--lend", "4G", "--insecure", "--listen", donors[0]]), \
            Daemon(["--lend", "4G", "--insecure", "--listen", donors[1]]), \
            Daemon(["--lend", "4G", "--insecure", "--listen", donors[2]]):
        for r in range(a.rounds):
            for mode in MODES:
                runs[mode].append(far(donors, mode, a, ssd_dir))
                print(f"round {r + 1}/{a.rounds} {mode}: {runs[mode][-1]}", flush=True)
    med = {m: {k: statistics.median(x[k] for x in runs[m]) for k, _ in RATES} for m in MODES}
    rows = []
    for m in MODES:
        row = {"mode": m}
        for k, _ in RATES:
            row[f"{k}_pages_per_s"] = round(med[m][k])
            row[f"{k}_ratio"] = round(med[m][k] / med["plain"][k], 3)
        rows.append(row)
    cols = [Column("mode", "mode")]
    for k, _ in RATES:
        cols += [Column(f"{k}_pages_per_s", f"{k} pages/s"), Column(f"{k}_ratio", "x plain", "{:.2f}")]
    plots = [Bars("mode", [(f"{k}_ratio", k) for k, _ in RATES], "rate / plain (same run)",
                  title=f"memlend far {a.size} region, {a.local} local, loopback donors: cost of safety",
                  hlines=[(0.9, "encryption goal: >= 0.90")])]
    report("reliability_cost", rows, cols, plots,
           meta={"cpu_idle_pct_before": round(idle, 1), "rounds": a.rounds, "size": a.size,
                 "local": a.local, "runs": runs})


if __name__ == "__main__":
    main()
