"""A trace taken beside a timed phase, to say where a stall went (`bench/apps.py --trace`).

Every PERIOD_S it samples the memory cgroup's charge and failcnt, the kernel's reclaim and
swap counters (/proc/vmstat), memory pressure (/proc/pressure/memory), and every thread of
the cgroup's processes: its state, wchan and CPU time; a thread in D state also gives its
kernel stack (root). The client reports the wall clock of its slowest operation
(`max_at_unix_s`); `around` keeps the samples from just before it to just after it ended,
each as the change since the sample before, so a half-second stall reads as what moved
while it lasted. Bounded: at most MAX_SAMPLES samples (the oldest go) and MAX_TASKS
threads a sample."""

import collections
import os
import signal
import subprocess
import threading
import time

PERIOD_S = 0.01
MAX_SAMPLES = 60_000  # 10 minutes at PERIOD_S
MAX_TASKS = 96
VMSTAT_KEYS = ("allocstall_normal", "allocstall_movable", "pgscan_direct", "pgsteal_direct",
               "pgscan_kswapd", "pswpin", "pswpout", "pgmajfault", "workingset_refault_anon",
               "workingset_refault_file", "thp_split_page", "compact_stall")


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def vmstat():
    out = {}
    for line in (read("/proc/vmstat") or "").splitlines():
        k, _, v = line.partition(" ")
        if k in VMSTAT_KEYS:
            out[k] = int(v)
    return out


def pressure_us():
    """/proc/pressure/memory: 'some' and 'full' total stall time, us."""
    out = {}
    for line in (read("/proc/pressure/memory") or "").splitlines():
        kind, *fields = line.split()
        for f in fields:
            if f.startswith("total="):
                out[f"psi_mem_{kind}_us"] = int(f[6:])
    return out


def tasks(cg):
    """(tid, comm, state, wchan, cpu ticks, stack or None) for each thread in the cgroup."""
    out = []
    pids = [p for p in (read(os.path.join(cg, "cgroup.procs")) or "").split()]
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            if len(out) >= MAX_TASKS:
                return out
            d = f"/proc/{pid}/task/{tid}"
            st = read(f"{d}/stat")
            if not st:
                continue
            comm = st[st.index("(") + 1:st.rindex(")")]
            f = st[st.rindex(")") + 2:].split()
            state, ticks = f[0], int(f[11]) + int(f[12])
            stack = None
            if state == "D":
                stack = (read(f"{d}/stack") or "").strip().replace("\n", " < ")[:500]
            out.append((int(tid), comm, state, (read(f"{d}/wchan") or "").strip(), ticks, stack))
    return out


def threads_named(cg, comm):
    out = []
    for pid in (read(os.path.join(cg, "cgroup.procs")) or "").split():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        out += [tid for tid in tids if (read(f"/proc/{pid}/task/{tid}/comm") or "").strip() == comm]
    return out


class StallTrace:
    """With `perf_path`, also `perf record` (cpu-clock, DWARF call chains) of the fault handler
    threads (`memlend-fault`) while it runs; `perf_around` gives their stacks in a window."""

    def __init__(self, cg, perf_path=None):
        self.cg = cg
        self.samples = collections.deque(maxlen=MAX_SAMPLES)
        self.stop_ev = threading.Event()
        self.perf = None
        self.perf_path = perf_path
        tids = threads_named(cg, "memlend-fault") if perf_path else []
        if tids:
            self.perf = subprocess.Popen(
                ["perf", "record", "-q", "-e", "cpu-clock", "-F", "1000", "--call-graph", "dwarf,8192",
                 "-k", "CLOCK_MONOTONIC", "-t", ",".join(tids), "-o", perf_path],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.th = threading.Thread(target=self.loop, daemon=True)
        self.th.start()

    def sample(self):
        s = {"t": time.time()}
        for name, key in (("memory.usage_in_bytes", "cg_usage_kib"), ("memory.failcnt", "cg_failcnt")):
            v = read(os.path.join(self.cg, name))
            if v is not None:
                s[key] = int(v) // (1024 if key.endswith("kib") else 1)
        s.update(vmstat())
        s.update(pressure_us())
        s["tasks"] = tasks(self.cg)
        return s

    def loop(self):
        while not self.stop_ev.wait(PERIOD_S):
            self.samples.append(self.sample())

    def stop(self):
        self.stop_ev.set()
        self.th.join()
        if self.perf:
            self.perf.send_signal(signal.SIGINT)
            try:
                self.perf.wait(60)
            except subprocess.TimeoutExpired:
                self.perf.kill()
                self.perf.wait()

    def around(self, at_s, dur_s, margin_s=0.1):
        """The samples from at_s - margin_s to at_s + dur_s + margin_s, each as its change since
        the one before: counters as deltas, threads by (tid, comm) with their state, wchan, CPU
        ticks used, and stack when in D."""
        samples = list(self.samples)
        out, prev = [], None
        for s in samples:
            if prev is not None and at_s - margin_s <= s["t"] <= at_s + dur_s + margin_s:
                row = {"t_ms": round((s["t"] - at_s) * 1e3, 1)}
                for k, v in s.items():
                    if k in ("t", "tasks"):
                        continue
                    if k == "cg_usage_kib":
                        row[k] = v
                    elif k in prev:
                        row[k] = v - prev[k]
                was = {t[0]: t[4] for t in prev["tasks"]}
                row["tasks"] = [f"{tid} {comm} {state} {wchan} +{ticks - was.get(tid, ticks)}"
                                + (f" | {stack}" if stack else "")
                                for tid, comm, state, wchan, ticks, stack in s["tasks"]]
                out.append(row)
            prev = s
        return out

    def perf_around(self, at_unix_s, dur_s, frames=6, top=20):
        """The handler's sampled stacks from at_unix_s to its end, most frequent first, two ways:
        by the innermost `frames` functions ("inner"), and by memlend's own functions on the
        stack, outermost first ("ours": which part of the handler the time went to)."""
        if not self.perf or not os.path.exists(self.perf_path):
            return {}
        at = at_unix_s - (time.time() - time.monotonic())
        r = subprocess.run(["perf", "script", "-i", self.perf_path, "--time", f"{at:.6f},{at + dur_s:.6f}",
                            "-F", "tid,time,ip,sym"], capture_output=True, text=True, timeout=600)
        inner, ours = collections.Counter(), collections.Counter()
        stack = []
        for line in r.stdout.splitlines() + [""]:
            if not line.strip():
                if stack:
                    inner[" < ".join(stack[:frames])] += 1
                    mine = [f.split("<")[0] for f in stack if f.startswith("memlend_")]
                    mine = [f for i, f in enumerate(mine) if i == 0 or f != mine[i - 1]]
                    ours[" > ".join(reversed(mine[-8:]))] += 1
                stack = []
            elif line.startswith((" ", "\t")):
                parts = line.split(None, 1)
                stack.append(parts[1].split("+0x")[0][:100] if len(parts) > 1 else "?")
        return {"samples": sum(inner.values()),
                "inner": [[n, st] for st, n in inner.most_common(top)],
                "ours": [[n, st] for st, n in ours.most_common(top)]}
