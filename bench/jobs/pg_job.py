#!/usr/bin/python3
"""PostgreSQL with its shared buffers as large as its data: a pgbench database of --size (scale
size / 15 MiB), shared_buffers = --size, the server and pgbench as the `postgres` user, everything
inside the job (so inside the peer's memory cgroup and, for memlend, under `memlend run`).

  --mix select   pgbench select-only with zipfian account ids (random_zipfian, s = 1.01)
  --mix tpcb     pgbench's default TPC-B-like transaction

Phases: initdb and pgbench -i (untimed), warm-up (--warm-seconds of the same mix), timed
(--seconds, 4 clients, 2 threads), verify (untimed): 0 failed transactions, pg_amcheck clean
over every table and index, and TPC-B's invariant: the sums of account, teller and branch
balances each equal the sum of the history's deltas (select-only: every balance still 0).
Prints one JSON line: transactions per second (ops_per_s), latency average, verified. Needs
root (it sets vm.unprivileged_userfaultfd to 1 for the run, then back: the postgres user
borrows through userfaultfd under memlend run)."""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

SCALE_MIB = 15
ZIPF = "\\set aid random_zipfian(1, {n}, 1.01)\nSELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n"
UNPRIV = "/proc/sys/vm/unprivileged_userfaultfd"


def pg_bin():
    root = "/usr/lib/postgresql"
    versions = sorted(os.listdir(root), key=lambda v: int(v) if v.isdigit() else 0)
    return os.path.join(root, versions[-1], "bin")


def as_pg(args, check=True, **kw):
    env = dict(os.environ, PATH=pg_bin() + ":" + os.environ.get("PATH", ""))
    return subprocess.run(["runuser", "-u", "postgres", "--"] + args, env=env, check=check,
                          capture_output=True, text=True, **kw)


def sql(sock, query):
    return as_pg(["psql", "-h", sock, "-At", "-c", query, "postgres"]).stdout.strip()


def pgbench(sock, args):
    out = as_pg(["pgbench", "-h", sock] + args + ["postgres"], check=False)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise SystemExit(f"pgbench {args}: exit {out.returncode}: {text[-800:]}")
    get = lambda pat: re.search(pat, text)  # noqa: E731
    failed = get(r"number of failed transactions: (\d+)")
    return {"tps": float(get(r"tps = ([\d.]+) \(without")[1]),
            "tx": int(get(r"number of transactions actually processed: (\d+)")[1]),
            "failed": int(failed[1]) if failed else 0,
            "lat_ms": float(get(r"latency average = ([\d.]+) ms")[1])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, required=True, help="bytes")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warm-seconds", type=float, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mix", choices=["select", "tpcb"], default="select")
    a = ap.parse_args()
    mib = a.size >> 20
    scale = max(1, mib // SCALE_MIB)
    work = f"/var/tmp/memlend-pgjob-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    shutil.chown(work, "postgres")
    data, sock = os.path.join(work, "data"), work
    with open(UNPRIV) as f:
        unpriv = f.read().strip()
    server = None
    try:
        with open(UNPRIV, "w") as f:
            f.write("1")
        t0 = time.time()
        as_pg(["initdb", "-D", data, "-A", "trust"])
        with open(os.path.join(data, "postgresql.conf"), "a") as f:
            f.write(f"shared_buffers = {mib}MB\nlisten_addresses = ''\nunix_socket_directories = '{sock}'\n"
                    "max_connections = 20\nhuge_pages = off\nfsync = off\nsynchronous_commit = off\n")
        env = dict(os.environ, PATH=pg_bin() + ":" + os.environ.get("PATH", ""))
        server = subprocess.Popen(["runuser", "-u", "postgres", "--", os.path.join(pg_bin(), "postgres"),
                                   "-D", data], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            if as_pg(["pg_isready", "-h", sock], check=False).returncode == 0:
                break
            time.sleep(0.1)
        as_pg(["pgbench", "-h", sock, "-i", "-q", "-s", str(scale), "postgres"])
        build_s = time.time() - t0
        script = os.path.join(work, "zipf.sql")
        with open(script, "w") as f:
            f.write(ZIPF.format(n=scale * 100_000))
        shutil.chown(script, "postgres")
        mix = ["-f", script] if a.mix == "select" else []
        common = mix + ["-c", "4", "-j", "2", "--random-seed", str(a.seed)]
        if a.warm_seconds > 0:
            pgbench(sock, common + ["-T", str(int(a.warm_seconds))])
        # -n: no vacuum, and so no truncation of the history, which keeps the warm-up's deltas for
        # the invariant below.
        timed = pgbench(sock, common + ["-n", "-T", str(int(a.seconds))])
        errors = []
        if timed["failed"]:
            errors.append(f"{timed['failed']} failed transactions")
        check = as_pg(["pg_amcheck", "-h", sock, "--install-missing", "--heapallindexed", "postgres"], check=False)
        if check.returncode != 0:
            errors.append("pg_amcheck: " + (check.stdout + check.stderr)[-400:])
        sums = [sql(sock, f"SELECT coalesce(sum({c}), 0) FROM pgbench_{t}")
                for t, c in (("accounts", "abalance"), ("tellers", "tbalance"), ("branches", "bbalance"),
                             ("history", "delta"))]
        rows = int(sql(sock, "SELECT count(*) FROM pgbench_accounts"))
        if len(set(sums)) != 1 or (a.mix == "select" and sums[0] != "0"):
            errors.append(f"balances disagree: accounts, tellers, branches, history = {sums}")
        if rows != scale * 100_000:
            errors.append(f"{rows} accounts, not {scale * 100_000}")
        print(json.dumps({"ops": timed["tx"], "seconds": a.seconds, "ops_per_s": round(timed["tps"], 1),
                          "unit": "transactions", "lat_avg_us": round(timed["lat_ms"] * 1000, 1),
                          "p50_us": None, "p99_us": None, "p999_us": None, "rows": rows,
                          "build_s": round(build_s, 1), "verified": not errors, "errors": errors}))
    finally:
        if server is not None:
            as_pg([os.path.join(pg_bin(), "pg_ctl"), "-D", data, "stop", "-m", "fast", "-w"], check=False)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
        with open(UNPRIV, "w") as f:
            f.write(unpriv)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
