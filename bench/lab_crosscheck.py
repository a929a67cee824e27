#!/usr/bin/env python3
"""The simulator checked against real daemons (issue 21, item 6).

One scripted scenario (bench/scenarios/lab16.json: 16 nodes of 256 MiB,
8 that only lend, 8 that each run one 64 MiB far-memory job) runs twice:
  - on a lab of real memlendd daemons: one network namespace and memory
    cgroup per node, a balloon holding each node's own use, and each job a
    `memlend far --pool` in its node, writing and checking every page;
  - in `memlend sim --scenario` at the same N, seconds and script.
Both are measured the same way, once a second after the 10 s warm-up:
  harvest = sum over nodes of min(need, borrowed), over
            min(what lenders could lend, what borrowers need)
  (the simulator's definition; the lab's used and borrowed bytes come from
  each daemon's --timeline samples), and demand-to-lease latency: the
  engine's handshake (request sent to lease confirmed) on each borrower,
  and, for the lab, also from the job's launch to its first ACK sent.

The tolerance is stated before the run (TOLERANCE below) and why.
Prints a table, writes bench/results/<name>.json and .png. Exit status 1
if a job lost a page or the two disagree beyond the tolerance.

Usage: lab_crosscheck.py [--scenario FILE] [--seconds 90] [--seed 1]
       [--name lab_crosscheck]   (root; run `make build` first)
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, bin_path  # noqa: E402

PREFIX, SUBNET = "xc", "10.79.0.0/24"
LAB = f"/run/memlend-lab-{PREFIX}"
WARMUP_S = 10  # as crates/sim/src/measure.rs
HIGH_MIN = 0.50  # the classifier's default (crates/pool/src/classify.rs)
# Why these bounds:
# - harvest, 10 points: the lab's nodes use more than their script says
#   (each daemon, and a job's own process and local pages, are charged to
#   the node), so lenders there can lend a little less; the simulator
#   samples demand once a second and moves no pages.
# - handshake latency, 20 ms at p50 and p99: both sides time the same
#   engine handshake (request sent to lease confirmed), the simulator in
#   process, the lab across network namespaces with a daemon scheduled on
#   2 shared cores: 1.1 ms p50 and 1.8 ms p99 there against 0.26 ms
#   (lab_crosscheck.json, 2026-11). 20 ms is ten times the lab's p99: past
#   it the real daemons wait for something (a timer, a retry) the
#   simulator lacks. (The bound was 1 s, which values near 1 ms could
#   never fail; the once-a-second demand sample bounds launch-to-ACK, not
#   the handshake.)
TOLERANCE = {"harvest_points": 10.0, "latency_ms": 20.0}
JOB_LOCAL = "8M"


def memlend(*args, check=True, timeout=120):
    r = subprocess.run([bin_path("memlend"), *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"memlend {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def node(i):
    return f"{PREFIX}-n{i + 1}"


def run_job(i, job, t0, runs):
    """One far-memory job in node i, from its start to its end (as scripted)."""
    time.sleep(max(0.0, t0 + job["start_s"] - time.time()))
    hold_s = job["end_s"] - job["start_s"]
    args = [bin_path("memlend"), "lab", "exec", node(i), "--", bin_path("memlend"), "far",
            "--pool", f"{LAB}/{node(i)}.sock", "--key", f"{LAB}/key", "--ssd", "/var/tmp",
            "--size", f"{job['far_mib']}M", "--local", JOB_LOCAL, "--random-passes", "0",
            "--hold-s", str(hold_s)]
    launched = time.time()
    r = subprocess.run(args, capture_output=True, text=True, timeout=hold_s + 300)
    runs.append({"node": i, "far_mib": job["far_mib"], "launched": launched, "ended": time.time(),
                 "rc": r.returncode, "out": r.stdout + r.stderr})


def timeline(i):
    samples, acks = [], []
    try:
        for line in open(f"{LAB}/{node(i)}.timeline"):
            e = json.loads(line)
            if "class" in e:
                samples.append(e)
            elif e.get("type") == "ack" and e.get("dir") == "send":
                acks.append(e["t_ms"] / 1000)
    except OSError:
        pass
    return samples, acks


def handshakes(i):
    r = memlend("status", "--json", "--api", f"{LAB}/{node(i)}.sock", check=False, timeout=10)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {}


def at(samples, t):
    """The sample nearest before wall time t (or the first)."""
    best = samples[0] if samples else None
    for s in samples:
        if s["t_ms"] / 1000 <= t:
            best = s
        else:
            break
    return best


def lab_run(sc, seconds):
    n = len(sc["nodes"])
    mem = {x["memory_mib"] for x in sc["nodes"]}
    if len(mem) != 1:
        raise SystemExit("the lab gives every node one --mem: the scenario's nodes must have the same memory_mib")
    mem_mib = mem.pop()
    memlend("lab", "down", "--prefix", PREFIX, check=False)
    memlend("lab", "up", str(n), "--mem", f"{mem_mib}M", "--prefix", PREFIX, "--subnet", SUBNET, timeout=300)
    t0 = time.time()
    for i, x in enumerate(sc["nodes"]):
        memlend("balloon", f"{x['used_mib']}M", "--node", node(i))
    runs, threads = [], []
    for i, x in enumerate(sc["nodes"]):
        for job in x.get("jobs", []):
            th = threading.Thread(target=run_job, args=(i, job, t0, runs))
            th.start()
            threads.append(th)
    time.sleep(max(0.0, t0 + seconds - time.time()))
    for th in threads:
        th.join()
    status = {i: handshakes(i) for i in range(n)}
    lines = {i: timeline(i) for i in range(n)}
    return t0, mem_mib, runs, status, lines


def lab_measures(sc, seconds, t0, mem_mib, runs, status, lines):
    n = len(sc["nodes"])
    harvest_sum = oracle_sum = 0.0
    series = []
    for s in range(WARMUP_S, seconds):
        t = t0 + s
        spare = need = useful = 0
        for i in range(n):
            want = sum(r["far_mib"] << 20 for r in runs if r["node"] == i and r["launched"] <= t < r["ended"])
            sample = at(lines[i][0], t)
            used = sample["used_bytes"] if sample else sc["nodes"][i]["used_mib"] << 20
            borrowed = sample["borrowed_bytes"] if sample else 0
            if want == 0:
                spare += max(0, int((mem_mib << 20) * HIGH_MIN) - used)
            need += want
            useful += min(want, borrowed)
        oracle_sum += min(spare, need)
        harvest_sum += useful
        series.append({"s": s, "need": need, "useful": useful, "oracle": min(spare, need)})
    launch_to_ack = []
    for r in runs:
        acks = [a for a in lines[r["node"]][1] if a >= r["launched"]]
        if acks:
            launch_to_ack.append(1000 * (acks[0] - r["launched"]))
    borrowers = sorted({r["node"] for r in runs if status[r["node"]].get("handshake_us_p50") is not None})
    hs_p50 = [status[i]["handshake_us_p50"] / 1000 for i in borrowers]
    hs_p99 = [status[i]["handshake_us_p99"] / 1000 for i in borrowers]
    return {
        "harvest_pct": 100 * harvest_sum / oracle_sum if oracle_sum else None,
        "handshake_ms_p50": median(hs_p50),
        "handshake_ms_p99": max(hs_p99, default=None),
        "launch_to_ack_ms_p50": median(launch_to_ack),
        "launch_to_ack_ms_max": max(launch_to_ack, default=None),
        "jobs": len(runs),
        "jobs_leased": len(launch_to_ack),
        "jobs_verified": sum(1 for r in runs if r["rc"] == 0 and f" 0 of {r['far_mib'] * 256} pages differ" in r["out"]),
        "handshakes": sum(status[i].get("handshakes") or 0 for i in borrowers),
        "series": series,
    }


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def sim_run(path, seconds, seed):
    r = subprocess.run([bin_path("memlend"), "sim", "--scenario", path, "--seconds", str(seconds),
                        "--seed", str(seed), "--json"], capture_output=True, text=True, timeout=600, check=True)
    o = json.loads(r.stdout)[0]["outcome"]
    return {"harvest_pct": o["harvest_pct"], "handshake_ms_p50": o["lease_latency_ms_p50"],
            "handshake_ms_p99": o["lease_latency_ms_p99"], "jobs_met": o["demand_met"]}


def verdict(lab, sim):
    why = []
    if lab["jobs_verified"] != lab["jobs"]:
        why.append(f"{lab['jobs'] - lab['jobs_verified']} of {lab['jobs']} jobs did not verify every page")
    if lab["harvest_pct"] is None or abs(lab["harvest_pct"] - sim["harvest_pct"]) > TOLERANCE["harvest_points"]:
        why.append(f"harvest {lab['harvest_pct']} vs {sim['harvest_pct']:.1f}%: over {TOLERANCE['harvest_points']} points")
    for q in ("handshake_ms_p50", "handshake_ms_p99"):
        if lab[q] is None or abs(lab[q] - sim[q]) > TOLERANCE["latency_ms"]:
            why.append(f"{q} {lab[q]} vs {sim[q]}: over {TOLERANCE['latency_ms']} ms")
    return why


def plot(lab, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s = lab["series"]
    xs = [r["s"] for r in s]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(xs, [r["need"] / (1 << 20) for r in s], label="need (jobs running)")
    ax.plot(xs, [r["oracle"] / (1 << 20) for r in s], label="oracle: min(spare, need)", linestyle="--")
    ax.plot(xs, [r["useful"] / (1 << 20) for r in s], label="lab: borrowed, useful")
    ax.set_xlabel("seconds since the lab came up")
    ax.set_ylabel("MiB")
    ax.set_title(f"16-node lab: harvest {lab['harvest_pct']:.1f}% of the oracle")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default=os.path.join(ROOT, "bench", "scenarios", "lab16.json"))
    ap.add_argument("--seconds", type=int, default=90)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--name", default="lab_crosscheck")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("lab_crosscheck: needs root (namespaces, cgroups)")
    sc = json.load(open(args.scenario))
    # SIGTERM/SIGHUP end the run through the same `finally` as an error.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    try:
        t0, mem_mib, runs, status, lines = lab_run(sc, args.seconds)
    finally:
        memlend("lab", "down", "--prefix", PREFIX, check=False, timeout=300)
    lab = lab_measures(sc, args.seconds, t0, mem_mib, runs, status, lines)
    sim = sim_run(args.scenario, args.seconds, args.seed)
    why = verdict(lab, sim)
    f = lambda v, d=1: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    print(f"\n{len(sc['nodes'])} nodes, {args.seconds} s, scenario {os.path.basename(args.scenario)}")
    print(f"{'':10} {'harvest%':>9} {'lease p50 ms':>13} {'lease p99 ms':>13} {'jobs':>8}")
    print(f"{'simulator':10} {f(sim['harvest_pct']):>9} {f(sim['handshake_ms_p50'], 2):>13} "
          f"{f(sim['handshake_ms_p99'], 2):>13} {sim['jobs_met']:>8}")
    print(f"{'lab':10} {f(lab['harvest_pct']):>9} {f(lab['handshake_ms_p50'], 2):>13} "
          f"{f(lab['handshake_ms_p99'], 2):>13} {lab['jobs_verified']:>4}/{lab['jobs']:<3}")
    print(f"lab, launch of a job to its first ACK: p50 {f(lab['launch_to_ack_ms_p50'])} ms, "
          f"max {f(lab['launch_to_ack_ms_max'])} ms ({lab['jobs_leased']} of {lab['jobs']} jobs)")
    print(f"tolerance: harvest within {TOLERANCE['harvest_points']:.0f} points, "
          f"latency within {TOLERANCE['latency_ms']:.0f} ms")
    out = os.path.join(ROOT, "bench", "results", args.name)
    runs_out = [{k: v for k, v in r.items() if k != "out"} | {"tail": r["out"][-400:]} for r in runs]
    json.dump({"scenario": args.scenario, "seconds": args.seconds, "seed": args.seed, "tolerance": TOLERANCE,
               "simulator": sim, "lab": lab, "jobs": runs_out, "disagreements": why},
              open(out + ".json", "w"), indent=1)
    plot(lab, out + ".png")
    print(f"wrote {out}.json and .png")
    if why:
        print("DISAGREE:\n  " + "\n  ".join(why))
        sys.exit(1)
    print("the lab and the simulator agree within the tolerance")


if __name__ == "__main__":
    main()
