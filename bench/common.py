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


def bin_path(name):
    p = os.path.join(ROOT, "target", "release", name)
    if not os.path.exists(p):
        raise SystemExit(f"{p} is missing: run `make build` first")
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout_s=10.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port} after {timeout_s} s")


class Daemon:
    """memlendd for the length of a `with` block; stopped on every exit."""

    def __init__(self, args, wait_ports=None):
        self.args = args
        self.proc = None
        self.wait_ports = wait_ports

    def __enter__(self):
        log = open(os.path.join(RESULTS, "memlendd.log"), "a") if os.path.isdir(RESULTS) else subprocess.DEVNULL
        self.proc = subprocess.Popen([bin_path("memlendd")] + self.args, stderr=log)
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
