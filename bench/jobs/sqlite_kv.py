#!/usr/bin/python3
"""SQLite with a skewed query mix: one in-memory database (PRAGMA page_size 65536, so that each
page cache entry is one malloc of ~64 KiB, which `memlend run --threshold 64K` puts in far
memory), a table kv(id INTEGER PRIMARY KEY, n INTEGER, v TEXT) of --value-size text values
(JSON-ish records of phrases, which lz4 shrinks as it does redis's text values), queried with
keys drawn by YCSB's scrambled zipfian (keys.py):

  read-pct   point reads: SELECT v (checked: it carries its key and has its length)
  the rest   updates: UPDATE kv SET n = n + 1
  1 in 100   of the reads is instead a short range: SELECT count(*), sum(n) over 100 ids

Phases: load (untimed, transactions of 10 K rows), warm-up, timed, verify (untimed: count(*) is
the row count, sum(n) the updates made, and 200 random rows read back whole and right). Prints
one JSON line: queries per second (ops_per_s), latency per query p50/p99/p99.9, verified."""

import argparse
import json
import sqlite3
import sys
import time

import numpy as np

from keys import Keys, KeyStream

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu order item price total customer "
         "shipped pending region north south east west amount discount status active").split()
PHRASES = 400
BODIES = 4096
LOAD_TXN_ROWS = 10_000
RANGE_EVERY = 100
RANGE_IDS = 100
CHECK_ROWS = 200


def bodies(size, seed):
    """BODIES record bodies of `size` bytes: fields of phrases picked by Zipf's law (p ~ 1/rank),
    space-padded; a row's value is its key's head over body key % BODIES, cut to `size`."""
    rng = np.random.default_rng(seed)
    phrases = [" ".join(rng.choice(WORDS, rng.integers(2, 6))) for _ in range(PHRASES)]
    weights = 1.0 / np.arange(1, PHRASES + 1)
    out = []
    for _ in range(BODIES):
        fields = [f'"f{i}":"{phrases[p]}"' for i, p in enumerate(rng.choice(PHRASES, 64, p=weights / weights.sum()))]
        out.append((",".join(fields) + " " * size)[:size])
    return out


def value(key, size, bodies):
    """{"id":K,<body>} of exactly `size` bytes: it names its key, so a wrong row is seen."""
    head = f'{{"id":{key},'
    return head + bodies[key % BODIES][:size - len(head) - 1] + "}"


def load(db, rows, size, bodies):
    db.execute("PRAGMA page_size = 65536")
    db.execute("CREATE TABLE kv(id INTEGER PRIMARY KEY, n INTEGER NOT NULL, v TEXT NOT NULL)")
    for lo in range(0, rows, LOAD_TXN_ROWS):
        with db:
            db.executemany("INSERT INTO kv VALUES (?, 0, ?)",
                           ((k, value(k, size, bodies)) for k in range(lo, min(rows, lo + LOAD_TXN_ROWS))))


def run(db, keys, read_pct, size, seconds, rng, lat_us=None):
    """Queries until `seconds` pass; (queries, updates, errors)."""
    queries = updates = 0
    errors = []
    end = time.perf_counter() + seconds
    # Bounded by the deadline: 64 queries per pass.
    while time.perf_counter() < end:
        batch = keys.take(64)
        kinds = rng.random(64) * 100
        for key, kind in zip(batch.tolist(), kinds.tolist()):
            t0 = time.perf_counter()
            if kind >= read_pct:
                with db:
                    db.execute("UPDATE kv SET n = n + 1 WHERE id = ?", (key,))
                updates += 1
            elif queries % RANGE_EVERY == 0:
                db.execute("SELECT count(*), sum(n) FROM kv WHERE id BETWEEN ? AND ?",
                           (key, key + RANGE_IDS - 1)).fetchone()
            else:
                row = db.execute("SELECT v FROM kv WHERE id = ?", (key,)).fetchone()
                if row is None or len(row[0]) != size or not row[0].startswith(f'{{"id":{key},'):  # cheap check
                    errors.append(f"key {key}: {'missing' if row is None else 'wrong value'}")
            queries += 1
            if lat_us is not None:
                lat_us.append((time.perf_counter() - t0) * 1e6)
    return queries, updates, errors


def verify(db, rows, updates, size, bodies, rng):
    errors = []
    count, total = db.execute("SELECT count(*), sum(n) FROM kv").fetchone()
    if count != rows:
        errors.append(f"count(*) {count} != {rows}")
    if total != updates:
        errors.append(f"sum(n) {total} != {updates} updates")
    for k in rng.integers(0, rows, CHECK_ROWS).tolist():
        got = db.execute("SELECT v FROM kv WHERE id = ?", (k,)).fetchone()
        if got is None or got[0] != value(k, size, bodies):
            errors.append(f"row {k} read back wrong")
            break
    return errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, required=True, help="bytes of values")
    ap.add_argument("--value-size", type=int, default=1000)
    ap.add_argument("--read-pct", type=float, default=95)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warm-seconds", type=float, default=20)
    ap.add_argument("--zipf", type=float, default=0.99)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rows = a.size // a.value_size
    db = sqlite3.connect(":memory:", isolation_level=None)
    t0 = time.perf_counter()
    bodies_ = bodies(a.value_size, a.seed)
    load(db, rows, a.value_size, bodies_)
    out = {"job": "sqlite", "rows": rows, "load_s": round(time.perf_counter() - t0, 2)}
    keys = KeyStream(Keys(rows, a.zipf, a.seed + 2))
    rng = np.random.default_rng(a.seed + 3)
    _, warm_updates, errors = run(db, keys, a.read_pct, a.value_size, a.warm_seconds, rng)
    lat = []
    t1 = time.perf_counter()
    queries, updates, errs = run(db, keys, a.read_pct, a.value_size, a.seconds, rng, lat)
    secs = time.perf_counter() - t1
    errors += errs
    lat = np.array(lat)
    out.update({"seconds": round(secs, 2), "ops": queries, "ops_per_s": round(queries / secs, 1), "updates": updates,
                "p50_us": round(float(np.percentile(lat, 50)), 1), "p99_us": round(float(np.percentile(lat, 99)), 1),
                "p999_us": round(float(np.percentile(lat, 99.9)), 1), "unit": "queries"})
    errors += verify(db, rows, warm_updates + updates, a.value_size, bodies_, rng)
    out["verified"] = not errors
    out["errors"] = errors[:5]
    print(json.dumps(out), flush=True)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
