#!/usr/bin/python3
"""fio (nbd engine, libnbd) against memlend's NBD export and `nbdkit memory`,
in the same run, on 127.0.0.1.

    /usr/bin/python3 bench/nbd_fio.py [--runtime 10] [--server-cmd CMD] [--points a,b] [--tls]

Both servers get a 2 GiB export, prefilled with data so reads hit it. Each
point runs against memlend then nbdkit (the order alternates per point, so
drift in machine load does not favour one side). Prints IOPS, p50/p99
completion latency, the memlend/nbdkit ratio, each server's CPU time per I/O,
the load average and CPU pressure (PSI some avg10, %) at the start of each
point; writes bench/results/nbd_fio.{json,png}.

The memlend side is, in order of preference: --server-cmd (placeholders
{nbd_port} and {page_port}); target/release/memlendd; the nbd_serve example
(built if missing). Everything started here is stopped on exit.

--tls: both servers require TLS with client certificates (memlendd
--nbd-tls-cert/--nbd-tls-key/--nbd-tls-client-ca; nbdkit --tls=require
--tls-verify-peer), from a CA made here with openssl in a temporary
directory; fio connects with nbds://localhost, its client certificate put
in /etc/pki/libnbd for the run (root only; refused if that exists, and
removed on every exit). Results go to nbd_fio_tls.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from report import Bars, Column, report  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = "2G"
MEMLENDD = os.path.join(common.release_dir(), "memlendd")
EXAMPLE = os.path.join(common.release_dir(), "examples", "nbd_serve")

# name, fio rw, block size, iodepth per job, jobs (connections), extra args
POINTS = [
    ("randread 4k QD1", "randread", "4k", 1, 1, []),
    ("randread 4k QD32", "randread", "4k", 32, 1, []),
    ("randwrite 4k QD1", "randwrite", "4k", 1, 1, []),
    ("randwrite 4k QD32", "randwrite", "4k", 32, 1, []),
    ("randrw70 4k QD32", "randrw", "4k", 32, 1, ["--rwmixread=70"]),
    ("read 64k QD8", "read", "64k", 8, 1, []),
    ("write 64k QD8", "write", "64k", 8, 1, []),
    # Two connections: one fio job saturates its own core at QD32 (see docs).
    ("randread 4k 2x QD16", "randread", "4k", 16, 2, []),
    ("randwrite 4k 2x QD16", "randwrite", "4k", 16, 2, []),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout_s=15.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s} s")


class Servers:
    """Starts servers in their own process groups; stop() ends them all."""

    def __init__(self):
        self.procs = []

    def start(self, argv, log_name):
        log = open(os.path.join("/tmp", log_name), "w")
        print("starting:", " ".join(shlex.quote(a) for a in argv), flush=True)
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs = []


def openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def new_key(cwd, key, out, subj, *extra):
    openssl(cwd, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", out, "-subj", subj, *extra)


def make_pki(root):
    """A CA, a server certificate for localhost and a client certificate,
    laid out as nbdkit (server/) and libnbd (client/) read them. memlendd
    takes the server files by name."""
    new_key(root, "ca-key.pem", "ca-cert.pem", "/CN=bench CA", "-x509", "-days", "2",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        with open(os.path.join(root, f"{name}.ext"), "w") as f:
            f.write(f"basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"
                    "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        new_key(root, f"{name}-key.pem", f"{name}.csr", f"/CN={name}")
        openssl(root, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-out", f"{name}-cert.pem", "-days", "2", "-extfile", f"{name}.ext")
    dirs = {}
    for side, files in (("server", ("server-cert.pem", "server-key.pem")),
                        ("client", ("client-cert.pem", "client-key.pem"))):
        d = os.path.join(root, side)
        os.makedirs(d)
        for f in ("ca-cert.pem",) + files:
            os.link(os.path.join(root, f), os.path.join(d, f))
        dirs[side] = d
    return dirs


# Set by main with --tls: {"server": dir, "client": dir}.
TLS = {}


def uri(port):
    # fio's nbd engine refuses tls-certificates= in the URI (libnbd's
    # local file rule): libnbd reads root's default directory instead.
    return f"nbds://localhost:{port}/" if TLS else f"nbd://127.0.0.1:{port}/"


LIBNBD_PKI = "/etc/pki/libnbd"


def install_client_pki(client_dir):
    """Put the client files where libnbd looks when run as root; returns the
    directories made, to remove. Refuses to touch an existing one."""
    if os.geteuid() != 0:
        sys.exit("--tls needs root: fio reads client certificates from /etc/pki/libnbd")
    if os.path.exists(LIBNBD_PKI):
        sys.exit(f"--tls: {LIBNBD_PKI} exists already; not overwriting it")
    made = [d for d in (os.path.dirname(LIBNBD_PKI), LIBNBD_PKI) if not os.path.exists(d)]
    os.makedirs(LIBNBD_PKI)
    for f in os.listdir(client_dir):
        shutil.copy(os.path.join(client_dir, f), LIBNBD_PKI)
    return made


def remove_client_pki(made):
    if made:
        shutil.rmtree(made[0])


def memlend_argv(args, nbd_port, page_port):
    if args.server_cmd:
        cmd = args.server_cmd.format(nbd_port=nbd_port, page_port=page_port)
        return shlex.split(cmd)
    if os.path.exists(MEMLENDD):
        tls = []
        if TLS:
            d = TLS["server"]
            tls = ["--nbd-tls-cert", f"{d}/server-cert.pem", "--nbd-tls-key", f"{d}/server-key.pem",
                   "--nbd-tls-client-ca", f"{d}/ca-cert.pem"]
        return [MEMLENDD, "--lend", SIZE, "--listen", f"127.0.0.1:{page_port}",
                "--nbd", f"127.0.0.1:{nbd_port}", "--insecure"] + tls
    if TLS:
        sys.exit("--tls needs target/release/memlendd (the nbd_serve example has no TLS)")
    if not os.path.exists(EXAMPLE):
        print("building the nbd_serve example (release)", flush=True)
        subprocess.run(["cargo", "build", "--release", "-p", "memlend-server", "--example", "nbd_serve"],
                       cwd=REPO, check=True)
    return [EXAMPLE, "--listen", f"127.0.0.1:{nbd_port}", "--size", SIZE]


def cpu_s(pid):
    """User + system CPU seconds of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fio(port, rw, bs, qd, jobs, extra, runtime_s):
    argv = ["fio", "--name=p", "--ioengine=nbd", f"--uri={uri(port)}",
            f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}", f"--numjobs={jobs}", "--group_reporting",
            f"--size={SIZE}", "--time_based", f"--runtime={runtime_s}", "--norandommap",
            "--randrepeat=0", "--output-format=json"] + extra
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"fio failed: {out.stderr}\n{out.stdout[-2000:]}")
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    if job["error"]:
        raise RuntimeError(f"fio job error {job['error']}")
    return job


def summarize(job, rw):
    """IOPS (both directions) and clat percentiles of the main direction
    (write for write-only points, read otherwise)."""
    main = "write" if rw in ("write", "randwrite") else "read"
    iops = job["read"]["iops"] + job["write"]["iops"]
    pct = job[main]["clat_ns"].get("percentile", {})
    ios = job["read"]["total_ios"] + job["write"]["total_ios"]
    return {"iops": iops, "ios": ios,
            "p50_us": pct.get("50.000000", 0) / 1000, "p99_us": pct.get("99.000000", 0) / 1000}


def prefill(port):
    argv = ["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri(port)}", "--rw=write",
            "--bs=1M", "--iodepth=8", f"--size={SIZE}", "--output-format=json"]
    subprocess.run(argv, check=True, capture_output=True)


def cpu_pressure_pct():
    """Share of the last 10 s in which some task waited for a CPU (PSI).
    Unlike the load average it is not inflated by the run's own threads
    when there are cores to spare."""
    try:
        with open("/proc/pressure/cpu") as f:
            return float(f.readline().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return None


def run_point(point, servers, runtime_s, flip):
    name, rw, bs, qd, jobs, extra = point
    row = {"point": name, "load1_start": round(os.getloadavg()[0], 2), "cpu_psi10_pct": cpu_pressure_pct()}
    order = list(servers.items())
    if flip:
        order.reverse()
    for label, (port, pid) in order:
        cpu0 = cpu_s(pid)
        s = summarize(fio(port, rw, bs, qd, jobs, extra, runtime_s), rw)
        cpu_us = (cpu_s(pid) - cpu0) * 1e6
        row[f"{label}_iops"] = round(s["iops"])
        row[f"{label}_p50_us"] = round(s["p50_us"], 1)
        row[f"{label}_p99_us"] = round(s["p99_us"], 1)
        row[f"{label}_cpu_us_per_io"] = round(cpu_us / max(1, s["ios"]), 2)
    row["ratio"] = round(row["memlend_iops"] / max(1, row["nbdkit_iops"]), 2)
    row["load1_end"] = round(os.getloadavg()[0], 2)
    return row


COLUMNS = [
    Column("point", "point"),
    Column("memlend_iops", "memlend IOPS", "{:,}"),
    Column("nbdkit_iops", "nbdkit IOPS", "{:,}"),
    Column("ratio", "ratio", "{:.2f}x"),
    Column("memlend_p50_us", "m p50 us", "{:.1f}"),
    Column("memlend_p99_us", "m p99 us", "{:.1f}"),
    Column("nbdkit_p50_us", "k p50 us", "{:.1f}"),
    Column("nbdkit_p99_us", "k p99 us", "{:.1f}"),
    Column("memlend_cpu_us_per_io", "m cpu us/io", "{:.1f}"),
    Column("nbdkit_cpu_us_per_io", "k cpu us/io", "{:.1f}"),
    Column("load1_start", "load", "{:.2f}"),
    Column("cpu_psi10_pct", "psi%", "{:.0f}"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", type=int, default=10, help="seconds per point and server")
    ap.add_argument("--server-cmd", help="memlend server command; {nbd_port} {page_port} are filled in")
    ap.add_argument("--points", help="comma-separated subset of point names")
    ap.add_argument("--name", help="results file name (default nbd_fio, or nbd_fio_tls with --tls)")
    ap.add_argument("--tls", action="store_true", help="both servers require TLS and client certificates")
    args = ap.parse_args()
    args.name = args.name or ("nbd_fio_tls" if args.tls else "nbd_fio")
    pki_dir = tempfile.TemporaryDirectory(prefix="nbd_fio_pki.") if args.tls else None
    made = []
    if pki_dir:
        TLS.update(make_pki(pki_dir.name))
    for tool in ("fio", "nbdkit"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            sys.exit(f"{tool} is missing: apt-get install {tool}")
    points = POINTS
    if args.points:
        wanted = {p.strip() for p in args.points.split(",")}
        points = [p for p in POINTS if p[0] in wanted]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    servers = Servers()
    try:
        if TLS:
            made = install_client_pki(TLS["client"])
        m_port, page_port, k_port = free_port(), free_port(), free_port()
        m = servers.start(memlend_argv(args, m_port, page_port), "nbd_fio_memlend.log")
        k_tls = ["--tls=require", f"--tls-certificates={TLS['server']}", "--tls-verify-peer"] if TLS else []
        k = servers.start(["nbdkit", "--foreground", "--exit-with-parent", "--port", str(k_port),
                           "--ipaddr", "127.0.0.1"] + k_tls + ["memory", SIZE], "nbd_fio_nbdkit.log")
        wait_port(m_port, m)
        wait_port(k_port, k)
        for port in (m_port, k_port):
            prefill(port)
        live = {"memlend": (m_port, m.pid), "nbdkit": (k_port, k.pid)}
        rows = []
        for i, point in enumerate(points):
            rows.append(run_point(point, live, args.runtime, flip=i % 2 == 1))
            r = rows[-1]
            print(f"{r['point']:<24} memlend {r['memlend_iops']:>9,}  nbdkit {r['nbdkit_iops']:>9,}"
                  f"  {r['ratio']:.2f}x  load {r['load1_start']}", flush=True)
    finally:
        servers.stop()
        remove_client_pki(made)
        if pki_dir:
            pki_dir.cleanup()
    meta = {"runtime_s": args.runtime, "tls": args.tls, "size": SIZE, "memlend_cmd": memlend_argv(args, m_port, page_port),
            "nproc": os.cpu_count(), "loadavg_end": os.getloadavg(),
            "fio": subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip(),
            "nbdkit": subprocess.run(["nbdkit", "--version"], capture_output=True, text=True).stdout.strip()}
    plots = [
        Bars(x="point", series=[("memlend_iops", "memlend"), ("nbdkit_iops", "nbdkit memory")],
             ylabel="IOPS", title=f"fio nbd engine, 127.0.0.1, 2 GiB prefilled{', TLS' if args.tls else ''}"),
        Bars(x="point", series=[("memlend_p99_us", "memlend p99"), ("nbdkit_p99_us", "nbdkit p99"),
                                ("memlend_p50_us", "memlend p50"), ("nbdkit_p50_us", "nbdkit p50")],
             ylabel="completion latency (us)", log=True),
    ]
    print()
    report(args.name, rows, COLUMNS, plots=plots, meta=meta,
           title=f"NBD{' over TLS' if args.tls else ''}: memlend vs nbdkit memory, fio nbd engine, "
                 f"{args.runtime} s per point")


if __name__ == "__main__":
    main()
