#!/usr/bin/env python3
"""The ACMS Figure 6 scenario on a lab of three nodes, as a test and a demo.

  A (n1) idle: a server.   B (n2) busy: a far-memory job borrows from A.
  C (n3) busy (ballooned): neutral.
  Then A's own demand rises (balloon): A reclaims, B moves its pages home.
  C's balloon goes: C becomes a server. A starts a far-memory job of its
  own: A is a client now, and borrows from C.

Each node's traffic (its veth's counters) is sampled every 0.5 s and drawn
beside the control messages the daemons logged. Asserts: the classes change
as expected and do not oscillate (up to the end of the scenario: the 30
borrow/release cycles measured after it make B a client on purpose); every
page of B's (and A's) job verifies;
no lease is left anywhere at the end. Exit status 0 only if all hold.

Usage: acms_fig6.py [--out DIR]   (root; builds nothing: run `make build`)
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, bin_path  # noqa: E402

# Its own lab prefix, so a lab the user has up is never touched (--prefix
# sets another, so two runs can share the machine).
PREFIX, SUBNET = "f6", "10.78.0.0/24"
NODES, NAMES, A, B, C, LAB = [], {}, None, None, None, None


def set_prefix(prefix, subnet):
    global PREFIX, SUBNET, NODES, NAMES, A, B, C, LAB
    PREFIX, SUBNET = prefix, subnet
    NODES = [f"{PREFIX}-n{i}" for i in (1, 2, 3)]
    NAMES = dict(zip(NODES, "ABC"))
    A, B, C = NODES
    LAB = f"/run/memlend-lab-{PREFIX}"
# The far-memory jobs; with --delay-ms they shrink to SLOW_JOB, since each
# page of a random touch then costs a round trip of twice the delay.
JOB = {"size": 256 << 20, "local": 32 << 20}
# The mark that ends the scenario; the handshake cycles come after it.
SCENARIO_END = "no lease left anywhere"
SLOW_JOB = {"size": 64 << 20, "local": 16 << 20}


def memlend(*args, check=True, capture=False, timeout=120):
    cmd = [bin_path("memlend"), *args]
    r = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr if capture else ''}")
    return r


def status(node):
    r = memlend("status", "--json", "--api", f"{LAB}/{node}.sock", check=False, capture=True, timeout=10)
    return json.loads(r.stdout) if r.returncode == 0 else None


def veth_bytes(node):
    # The bridge side of each node's veth pair, seen from the root namespace.
    base = f"/sys/class/net/{PREFIX}-v{NODES.index(node) + 1}/statistics"
    try:
        return sum(int(open(f"{base}/{k}").read()) for k in ("rx_bytes", "tx_bytes"))
    except OSError:
        return 0


class Sampler(threading.Thread):
    """Traffic and class of every node, every 0.5 s, until stopped."""

    def __init__(self, t0):
        super().__init__(daemon=True)
        self.t0, self.rows, self.stop = t0, [], threading.Event()

    def run(self):
        last = {n: veth_bytes(n) for n in NODES}
        last_t = time.time()
        while not self.stop.wait(0.5):
            now = time.time()
            row = {"t_s": round(now - self.t0, 2)}
            for n in NODES:
                b = veth_bytes(n)
                row[f"{n}_mb_s"] = (b - last[n]) / (now - last_t) / 1e6
                last[n] = b
                st = status(n)
                row[f"{n}_class"] = st["node"]["class"] if st else "?"
                row[f"{n}_lent"] = st["node"]["lent_bytes"] if st else 0
                row[f"{n}_borrowed"] = st["node"]["borrowed_bytes"] if st else 0
            last_t = now
            self.rows.append(row)


def handshake_cycles(node, n):
    """Ask the node's daemon for 16 MiB and release it, n times, over its API
    socket: the time from asking to holding a confirmed lease."""
    import socket
    times = []
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(f"{LAB}/{node}.sock")
        f = s.makefile("rw")
        for _ in range(n):
            t = time.perf_counter()
            f.write(json.dumps({"want": {"bytes": 16 << 20}}) + "\n")
            f.flush()
            reply = json.loads(f.readline())
            times.append((time.perf_counter() - t) * 1e6)
            if "lease" not in reply:
                raise AssertionError(f"no lease for a 16 MiB want: {reply}")
            lease = reply["lease"]
            f.write(json.dumps({"release": {"donor": lease["donor"], "lease": lease["lease"]}}) + "\n")
            f.flush()
            time.sleep(0.05)
    times.sort()
    return {"n": n, "p50_us": round(times[n // 2]), "p99_us": round(times[min(n - 1, int(n * 0.99))]), "all_us": [round(t) for t in times]}


def wait_for(what, pred, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def job(node, hold_s, log, slow_net):
    args = ["lab", "exec", node, "--", bin_path("memlend"), "far", "--pool", f"{LAB}/{node}.sock",
            "--key", f"{LAB}/key", "--size", str(JOB["size"]), "--local", str(JOB["local"]), "--hold-s", str(hold_s),
            "--ssd", "/var/tmp"]
    if slow_net:
        # A random pass is one round trip per touch: minutes at 40 ms.
        args += ["--random-passes", "0"]
    return subprocess.Popen([bin_path("memlend"), *args], stdout=log, stderr=subprocess.STDOUT, text=True)


def classes(rows, node):
    """The sequence of distinct classes a node went through."""
    seq = []
    for r in rows:
        c = r[f"{node}_class"]
        if c != "?" and (not seq or seq[-1] != c):
            seq.append(c)
    return seq


def drop_control_datagrams(pct):
    """Each node drops pct% of the UDP datagrams it receives (the kernel
    here has no netem, so loss comes from iptables' statistic match; the
    rules go away with the namespaces)."""
    for n in NODES:
        subprocess.run(["ip", "netns", "exec", n, "iptables", "-A", "INPUT", "-p", "udp", "-m", "statistic",
                        "--mode", "random", "--probability", str(pct / 100), "-j", "DROP"], check=True)


def scenario(out, loss_pct, delay_ms):
    memlend("lab", "down", "--prefix", PREFIX, check=False)
    memlend("lab", "up", "3", "--mem", "1G", "--prefix", PREFIX, "--subnet", SUBNET)
    if loss_pct:
        drop_control_datagrams(loss_pct)
    if delay_ms:
        JOB.update(SLOW_JOB)
        # Every packet, data and control, waits delay_ms at its receiver.
        memlend("lab", "netem", *NODES, "--delay-ms", str(delay_ms))
    t0 = time.time()
    marks, handshakes = [], {}

    def mark(text):
        marks.append((round(time.time() - t0, 2), text))
        print(f"[{marks[-1][0]:6.1f} s] {text}", flush=True)

    wait_for("the nodes to find each other", lambda: all((status(n) or {}).get("peers", []).__len__() == 2 for n in NODES), 30)
    memlend("balloon", "600M", "--node", C)
    memlend("balloon", "550M", "--node", B)
    mark("B and C ballooned to 550M and 600M (neutral: busy, not short)")
    sampler = Sampler(t0)
    sampler.start()
    wait_for("A to offer memory", lambda: (status(A) or {}).get("node", {}).get("available_bytes", 0) >= JOB["size"], 30)
    log_b = open(os.path.join(out, "job_b.log"), "w")
    b = job(B, 35, log_b, delay_ms > 0)
    mark("B starts a far-memory job")
    wait_for("B to borrow from A", lambda: (status(A) or {}).get("node", {}).get("lent_bytes", 0) >= JOB["size"], 30)
    mark("B borrows from A")
    time.sleep(8)
    memlend("balloon", "600M", "--node", A)
    mark("A's own demand rises (balloon 600M)")
    wait_for("A to take its memory back", lambda: (status(A) or {}).get("node", {}).get("lent_bytes", 1) == 0, 60)
    mark("A has reclaimed everything")
    memlend("balloon", "0", "--node", C, "--release")
    mark("C's balloon released")
    wait_for("C to offer memory", lambda: (status(C) or {}).get("node", {}).get("available_bytes", 0) >= JOB["size"], 30)
    log_a = open(os.path.join(out, "job_a.log"), "w")
    a = job(A, 15, log_a, delay_ms > 0)
    mark("A starts a far-memory job of its own")
    # B's pages may be on C already (they go back to a lease once C has
    # room), so A's own borrowing is what to wait for.
    wait_for("A to borrow from C", lambda: (status(A) or {}).get("node", {}).get("borrowed_bytes", 0) >= JOB["size"], 30)
    mark("A borrows from C")
    rc_b, rc_a = b.wait(timeout=180), a.wait(timeout=180)
    mark(f"jobs done (B exit {rc_b}, A exit {rc_a})")
    wait_for("every lease to end", lambda: all((status(n) or {}).get("lent", [1]) == [] and (status(n) or {}).get("borrowed", [1]) == [] for n in NODES), 30)
    mark(SCENARIO_END)
    cycles = handshake_cycles(B, 30)
    mark(f"B: 30 borrow/release cycles of 16 MiB from C: p50 {cycles['p50_us']} us, p99 {cycles['p99_us']} us")
    for n in NODES:
        st = status(n) or {}
        handshakes[n] = {k: st.get(k) for k in ("handshakes", "handshake_us_p50", "handshake_us_p99", "sent", "received")}
    handshakes["api_cycles"] = cycles
    time.sleep(2)
    sampler.stop.set()
    sampler.join()
    return sampler.rows, marks, (rc_a, rc_b), t0, handshakes


def timelines():
    msgs = []
    for n in NODES:
        try:
            for line in open(f"{LAB}/{n}.timeline"):
                e = json.loads(line)
                if "dir" in e and e["dir"] == "send":
                    msgs.append((e["t_ms"] / 1000, n, e["type"]))
        except OSError:
            pass
    return msgs


def plot(rows, marks, msgs, t0_wall, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(4, 1, figsize=(10, 9), sharex=True, gridspec_kw={"height_ratios": [2, 2, 2, 1.5]})
    t = [r["t_s"] for r in rows]
    for ax, n in zip(axes, NODES):
        ax.plot(t, [r[f"{n}_mb_s"] for r in rows], lw=1.2)
        ax.set_ylabel(f"node {NAMES[n]}\nMB/s")
        for tm, _ in marks:
            ax.axvline(tm, color="0.85", lw=0.8, zorder=0)
        prev = None
        for r in rows:
            if r[f"{n}_class"] != prev:
                prev = r[f"{n}_class"]
                ax.annotate(prev, (r["t_s"], 0), xytext=(2, 2), textcoords="offset points", fontsize=7, color="C3")
    kinds = ["offer", "request", "grant", "ack", "reclaim", "release"]
    ax = axes[3]
    for (ts, n, kind) in msgs:
        if kind in kinds:
            ax.scatter(ts - t0_wall, NODES.index(n), marker="|", s=60, color=f"C{kinds.index(kind)}")
    ax.set_yticks(range(3), [NAMES[n] for n in NODES])
    ax.set_ylabel("messages\nsent")
    for i, k in enumerate(kinds):
        ax.scatter([], [], marker="|", color=f"C{i}", label=k)
    ax.legend(ncol=6, fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    axes[-1].set_xlabel("seconds")
    fig.suptitle("ACMS Figure 6 on memlend: B borrows from A; A reclaims; A borrows from C")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def check(rows, marks, rcs, out):
    failures = []
    # Classes are judged up to the end of the scenario: the borrow/release
    # cycles after it make B a client on purpose, 30 times in a few
    # seconds, and a sample can catch B either way between them.
    end_s = next((t for t, text in marks if text == SCENARIO_END), None)
    rows = [r for r in rows if end_s is None or r["t_s"] <= end_s]
    # A may go from server straight to client (its own job's demand can come
    # before the hold has let it show as neutral); either way it must lend
    # first and borrow later.
    want = {A: ["server", "client"], B: ["client"], C: ["neutral", "server"]}
    for n, seq in want.items():
        got = classes(rows, n)
        it = iter(got)
        if not all(c in it for c in seq):
            failures.append(f"node {NAMES[n]}: classes {got}, expected {seq} in order")
        if len(got) > 5:
            failures.append(f"node {NAMES[n]} oscillates: {got}")
    for name, rc, log in (("A", rcs[0], "job_a.log"), ("B", rcs[1], "job_b.log")):
        text = open(os.path.join(out, log)).read()
        if rc != 0 or " 0 of " not in text:
            failures.append(f"{name}'s job: exit {rc}, pages did not all verify (see {log})")
    return failures


def diagnose(out):
    """What a failed run leaves to read: each node's status and the jobs' logs."""
    for n in NODES:
        print(f"--- status of {NAMES[n]} ({n}):\n{json.dumps(status(n), indent=1)}", flush=True)
    logs = [os.path.join(out, "job_b.log"), os.path.join(out, "job_a.log")]
    logs += [f"{LAB}/{n}.log" for n in NODES]
    for log in logs:
        try:
            tail = open(log).read().splitlines()[-40:]
            print(f"--- {log} (last 40 lines):\n" + "\n".join(tail), flush=True)
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "acms_fig6"))
    ap.add_argument("--loss-pct", type=float, default=0, help="drop this share of control datagrams at every node")
    ap.add_argument("--delay-ms", type=int, default=0, help="delay every packet this long at its receiver")
    ap.add_argument("--prefix", default=PREFIX)
    ap.add_argument("--subnet", default=SUBNET)
    args = ap.parse_args()
    set_prefix(args.prefix, args.subnet)
    os.makedirs(args.out, exist_ok=True)
    try:
        rows, marks, rcs, t0_wall, handshakes = scenario(args.out, args.loss_pct, args.delay_ms)
        msgs = timelines()
    except BaseException:
        diagnose(args.out)
        raise
    finally:
        memlend("lab", "down", "--prefix", PREFIX, check=False)
    failures = check(rows, marks, rcs, args.out)
    plot(rows, marks, msgs, t0_wall, os.path.join(args.out, "acms_fig6.png"))
    summary = {n: classes(rows, n) for n in NODES}
    json.dump({"rows": rows, "marks": marks, "messages": msgs, "classes": summary, "handshakes": handshakes,
               "failures": failures},
              open(os.path.join(args.out, "acms_fig6.json"), "w"), indent=1)
    print("\nclasses over time:")
    for n in NODES:
        print(f"  {NAMES[n]}: {' -> '.join(summary[n])}")
    print("handshakes (request sent to lease confirmed, as the borrower saw it):")
    for n in NODES:
        h = handshakes.get(n, {})
        if h.get("handshakes"):
            print(f"  {NAMES[n]}: {h['handshakes']} handshake(s), p50 {h['handshake_us_p50']} us, p99 {h['handshake_us_p99']} us")
    print(f"plot: {os.path.join(args.out, 'acms_fig6.png')}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("Figure 6 scenario: every expectation held")


if __name__ == "__main__":
    main()
