#!/usr/bin/env python3
"""Donor slowdown (ACMS Figure 8): how much does lending cost the donor's own
work? The goal is <= 5%.

The donor "machine" is CPU 0: its own workload (bench/touch.c over a local
region, uniform random touches, 50% writes) and its memlendd both run there.
The borrower is CPU 1: `memlend far` hammering the donor's lent memory with
remote faults. On separate machines the borrower would not share anything
with the donor; pinning keeps it off the donor's CPU so that what is measured
is the donor daemon's own cost (serving pages, its spin-wait, interrupts).

Three conditions, alternated ROUNDS times so drift hits all alike:
  alone      the workload, no memlendd
  lending    memlendd holds the borrower's pages, borrower idle
  serving    the borrower faults on the donor as fast as it can
and for `serving`, with the daemon's spin at 200 us polled at nice 19
(--spin-nice 19, the default: the poll takes only CPU the donor's work leaves), at 200 us
polled at the thread's own priority (--spin-nice 0), and with no spin
(--spin-us 0): a spinning connection thread takes CPU from the donor's work.
For `serving` it also records the borrower's faults/s and its store-fault
latency (p50, p99, p99.9: message read to wake, which holds the request's
wait for the donor): a poll at nice 19 that the donor's work preempts makes
a request wait, and only the tail shows that.

Prints a table; writes bench/results/donor_slowdown.{json,png}.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Daemon, bin_path, free_port, wait_quiet  # noqa: E402
from report import Bars, Column, report  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def build_touch(workdir):
    out = os.path.join(workdir, "touch")
    subprocess.run(["cc", "-O2", "-Wall", "-o", out, os.path.join(HERE, "touch.c"), "-lm"], check=True)
    return out


def workload(touch, size, seconds):
    """The donor's own work on CPU 0: touches per second, all local."""
    out = subprocess.run(["taskset", "-c", "0", touch, "--size", size, "--pattern", "uniform",
                          "--seconds", str(seconds), "--write-pct", "50", "--warmup-seconds", "1"],
                         capture_output=True, text=True, check=True).stdout
    import json
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)["touches_per_s"]
    raise RuntimeError("touch printed no result")


def borrower(port, size, local, seconds):
    """memlend far on CPU 1: a region 8x its budget, all pages on the donor."""
    return subprocess.Popen(["taskset", "-c", "1", bin_path("memlend"), "far", "--donor", f"127.0.0.1:{port}",
                             "--insecure", "--size", size, "--local", local, "--random-passes", "1",
                             "--hold-s", str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_round(touch, a, spin_us, spin_nice):
    """One measurement of each condition; returns touches/s per condition."""
    out = {"alone": workload(touch, a.size, a.seconds)}
    port = free_port()
    # The daemon starts on CPU 0, so every thread it ever makes (one per
    # connection) inherits CPU 0: it shares the donor's CPU, as it would on
    # a real donor.
    with Daemon(["--lend", "1G", "--listen", f"127.0.0.1:{port}", "--insecure", "--spin-us", str(spin_us),
                 "--spin-nice", str(spin_nice)],
                prefix=["taskset", "-c", "0"]):
        b = borrower(port, a.far_size, a.far_local, a.seconds + 6)
        time.sleep(4)  # past the first writes: the borrower faults steadily
        out["serving"] = workload(touch, a.size, a.seconds)
        text, _ = b.communicate(timeout=a.seconds + 120)
        if b.returncode != 0 or " 0 of " not in text:
            raise RuntimeError(f"the borrower failed:\n{text}")
        import re
        m = re.search(r"random touches \(verify\) (\d+) pages/s", text)
        out["borrower"] = int(m.group(1)) if m else None
        m = re.search(r"store-fault latency \(message read to wake\): p50 ([\d.]+) / p99 ([\d.]+) / p99.9 ([\d.]+) us",
                      text)
        if m:
            out["borrower_p50_us"], out["borrower_p99_us"], out["borrower_p999_us"] = map(float, m.groups())
        out["lending"] = workload(touch, a.size, a.seconds)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--size", default="256M", help="the donor's own working set")
    ap.add_argument("--far-size", default="512M")
    ap.add_argument("--far-local", default="64M")
    a = ap.parse_args()
    import tempfile
    work = tempfile.mkdtemp(prefix="memlend-slowdown-")
    touch = build_touch(work)
    idle = wait_quiet()
    rows = []
    for spin_us, spin_nice in ((200, 19), (200, 0), (0, 0)):
        runs = [run_round(touch, a, spin_us, spin_nice) for _ in range(a.rounds)]
        alone = statistics.median(r["alone"] for r in runs)
        for cond in ("alone", "lending", "serving"):
            v = statistics.median(r[cond] for r in runs)
            how = f"spin {spin_us} us" + (f" at nice {spin_nice}" if spin_us else "")
            rows.append({"condition": f"{cond} ({how})", "touches_per_s": round(v),
                         "slowdown_pct": round(100 * (1 - v / alone), 1),
                         "runs": [round(r[cond]) for r in runs]})
            if cond == "serving" and all(r.get("borrower") for r in runs):
                # the borrower's random faults while the donor's work ran beside them
                rows[-1]["borrower_pages_per_s"] = round(statistics.median(r["borrower"] for r in runs))
            for k in ("borrower_p50_us", "borrower_p99_us", "borrower_p999_us"):
                if cond == "serving" and all(k in r for r in runs):
                    # a poll at nice 19 preempted by the donor's work shows here: the request waits
                    rows[-1][k] = round(statistics.median(r[k] for r in runs), 1)
                    rows[-1][k.replace("_us", "_us_max")] = max(r[k] for r in runs)
    cols = [Column("condition", "donor condition"), Column("touches_per_s", "own touches/s"),
            Column("slowdown_pct", "slowdown %"), Column("borrower_pages_per_s", "borrower faults/s"),
            Column("borrower_p50_us", "borrower p50 us"), Column("borrower_p99_us", "p99 us"),
            Column("borrower_p999_us", "p99.9 us"), Column("borrower_p999_us_max", "worst p99.9 us"),
            Column("runs", "each round")]
    plots = [Bars("condition", [("slowdown_pct", "slowdown of the donor's own work (%)")], "%",
                  title="Donor slowdown while lending (ACMS Fig. 8); goal <= 5%", hlines=[(5, "goal 5%")])]
    report("donor_slowdown", rows, cols, plots,
           meta={"cpu_idle_pct_before": round(idle, 1), "rounds": a.rounds, "seconds": a.seconds,
                 "donor_working_set": a.size, "borrower_region": a.far_size, "borrower_local": a.far_local})


if __name__ == "__main__":
    main()
