"""What the benchmarks share: paths, ports, the daemon, floor tools.
Tables, JSON and plots are `report.py`."""
import os
import re
import signal
import socket
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")  # the daemon log goes here too
FLOORS_SRC = os.path.join(os.path.dirname(ROOT), "shared", "tools", "floors")


def release_dir():
    """Where the binaries come from: target/release, or MEMLEND_RELEASE_DIR to
    run a benchmark against another build (an A/B of two commits)."""
    return os.environ.get("MEMLEND_RELEASE_DIR") or os.path.join(ROOT, "target", "release")


def bin_path(name):
    p = os.path.join(release_dir(), name)
    if not os.path.exists(p):
        raise SystemExit(f"{p} is missing: run `make build` first")
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout_s=10.0):
    """Until someone listens on loopback `port`. A connect that met itself (the kernel chose
    `port`, an ephemeral one from free_port, as its own source) is not someone."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                if s.getsockname()[1] != port:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port} after {timeout_s} s")


class Daemon:
    """memlendd for the length of a `with` block; stopped on every exit."""

    def __init__(self, args, wait_ports=None, prefix=()):
        self.args = args
        self.proc = None
        self.wait_ports = wait_ports
        self.prefix = list(prefix)  # e.g. ["taskset", "-c", "0"]

    def __enter__(self):
        log = open(os.path.join(RESULTS, "memlendd.log"), "a") if os.path.isdir(RESULTS) else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.prefix + [bin_path("memlendd")] + self.args, stderr=log)
        ports = self.wait_ports or [int(self.args[self.args.index("--listen") + 1].rsplit(":", 1)[1])]
        for p in ports:
            wait_port(p)
        return self

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return False


def build_floor_tool(name):
    """Build one of shared/tools/floors into target/floors; None if absent."""
    src = os.path.join(FLOORS_SRC, f"{name}.c")
    if not os.path.exists(src):
        print(f"(floor tool {src} not found: floors not measured)")
        return None
    out_dir = os.path.join(ROOT, "target", "floors")
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, name)
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(src):
        subprocess.run(["gcc", "-O2", "-pthread", "-o", out, src], check=True)
    return out


def grab(text, pattern):
    m = re.search(pattern, text)
    if not m:
        raise SystemExit(f"cannot find {pattern!r} in: {text}")
    return float(m.group(1))


# ---- added for far_micro.py -------------------------------------------------


def meminfo_mib(key):
    """One /proc/meminfo field (e.g. "MemAvailable") in MiB, or None."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return None


def floor_uffd_copy(pin="same", size_mib=512):
    """userfaultfd missing faults fixed by UFFDIO_COPY (shared/tools/floors/uffd_bench):
    {"p50_us", "p99_us", "faults_per_s"}; pin = same|diff|none; None if the tool is absent."""
    tool = build_floor_tool("uffd_bench")
    if tool is None:
        return None
    opener = "dev" if os.path.exists("/dev/userfaultfd") else "sys"
    out = subprocess.run([tool, opener, "copy", str(size_mib), pin], capture_output=True, text=True,
                         check=True).stdout
    return {"p50_us": grab(out, r"p50=([\d.]+)us"), "p99_us": grab(out, r"p99=([\d.]+)us"),
            "faults_per_s": grab(out, r"rate=(\d+) faults/s")}


def floor_tcp_rr(pin="same", req=16, resp=4096, n=100000):
    """One TCP loopback request/response with one in flight (shared/tools/floors/net_bench):
    {"p50_us", "p99_us", "ops_per_s"}; None if the tool is absent."""
    tool = build_floor_tool("net_bench")
    if tool is None:
        return None
    out = subprocess.run([tool, "rr", "tcp", str(req), str(resp), str(n), "1", pin], capture_output=True,
                         text=True, check=True).stdout
    return {"p50_us": grab(out, r"p50=([\d.]+)us"), "p99_us": grab(out, r"p99=([\d.]+)us"),
            "ops_per_s": grab(out, r"(\d+) ops/s")}


def floor_tcp_stream(secs=3, chunk=131072, pin="none"):
    """TCP loopback stream bandwidth in Gbit/s (net_bench); None if the tool is absent."""
    tool = build_floor_tool("net_bench")
    if tool is None:
        return None
    out = subprocess.run([tool, "stream", "tcp", str(chunk), str(int(max(1, secs))), pin], capture_output=True,
                         text=True, check=True).stdout
    return grab(out, r"([\d.]+) Gbit/s")


def cpu_psi_total_us():
    """/proc/pressure/cpu "some" total (microseconds), or None: take two and divide the
    difference by the wall time for the share of a run in which some task waited for a CPU."""
    try:
        with open("/proc/pressure/cpu") as f:
            return int(f.readline().split("total=")[1])
    except (OSError, IndexError, ValueError):
        return None


def cpu_idle_pct(window_s=2.0):
    """Share (%) of CPU time idle (idle + iowait) over the next window_s seconds."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v), v[3] + v[4]

    t0, i0 = snap()
    time.sleep(window_s)
    t1, i1 = snap()
    return 100.0 * (i1 - i0) / max(1, t1 - t0)


def wait_quiet(max_wait_s=60, min_idle_pct=80, window_s=2.0):
    """Wait (at most max_wait_s) until the CPUs are mostly idle, as
    shared/tools/floors/wait_quiet.sh does. Returns the last idle share (%)."""
    deadline = time.time() + max_wait_s
    while True:
        idle = cpu_idle_pct(window_s)
        if idle >= min_idle_pct or time.time() >= deadline:
            return idle


# ---- the floor of a store fault (far_micro.py, apps.py) ---------------------


def measure_floors(quiet_s=0):
    """A store fault's floor, measured now: one userfaultfd COPY fault plus one TCP
    loopback round trip with a 4 KiB reply, on one core ("same") and across cores
    ("diff"), and TCP stream bandwidth. {} if the tools are absent."""
    if quiet_s:
        wait_quiet(quiet_s, 80)
    fl = {}
    for pin in ("same", "diff"):
        u = floor_uffd_copy(pin)
        r = floor_tcp_rr(pin)
        if u and r:
            fl[f"uffd_copy_{pin}_p50_us"] = u["p50_us"]
            fl[f"uffd_copy_{pin}_faults_per_s"] = u["faults_per_s"]
            fl[f"tcp_rr_{pin}_p50_us"] = r["p50_us"]
            fl[f"floor_{pin}_p50_us"] = round(u["p50_us"] + r["p50_us"], 2)
    s = floor_tcp_stream(2)
    if s:
        fl["tcp_stream_gbit_per_s"] = s
        fl["tcp_stream_pages_per_s"] = round(s * 1e9 / 8 / 4096)
    return fl


def fmt_floors(fl):
    """The floors as one line."""
    if not fl:
        return "floor: not measured (shared/tools/floors missing)"
    return (f"floor (same run): uffd COPY p50 {fl['uffd_copy_same_p50_us']} us + TCP rr p50 "
            f"{fl['tcp_rr_same_p50_us']} us = {fl['floor_same_p50_us']} us same core; "
            f"{fl['uffd_copy_diff_p50_us']} + {fl['tcp_rr_diff_p50_us']} = {fl['floor_diff_p50_us']} us across cores; "
            f"TCP stream {fl.get('tcp_stream_gbit_per_s')} Gbit/s = {fl.get('tcp_stream_pages_per_s', 0) / 1e3:.0f} K pages/s")
