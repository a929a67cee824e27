#!/usr/bin/python3
"""An analytics job over a skewed working set: a table of float64 rows (1 KiB each) in one numpy
array, read in batches of rows drawn by YCSB's scrambled zipfian (keys.py), each batch a gather
(fancy indexing), a row sum over the measures and a group-by (bincount) over a category column;
--update-pct of the batches also add 1 to a counter column of their rows, once per draw.

Columns: 0 the row number; 1..32 measures with two decimals (prices: lz4 gets little from
them); 33..126 small integer codes (categories, flags, counts), which compress; 127 the counter.

Phases: build (untimed), warm-up (--warm-seconds), timed (--seconds), verify (untimed: every row
number in place, the counter column sums to the updates made, and the measure and code columns
sum exactly to what they summed to when built: every page read back as written). Prints one
JSON line: rows_per_s (ops_per_s), batch latency p50/p99/p99.9, verified."""

import argparse
import json
import sys
import time

import numpy as np

from keys import Keys, KeyStream

COLS = 128
MEASURES = slice(1, 33)
CODES = slice(33, 127)
CATEGORY = 40
COUNTER = 127
BUILD_ROWS = 8192


def build(rows, seed):
    table = np.empty((rows, COLS), dtype=np.float64)
    rng = np.random.default_rng(seed)
    for lo in range(0, rows, BUILD_ROWS):
        hi = min(rows, lo + BUILD_ROWS)
        n = hi - lo
        table[lo:hi, 0] = np.arange(lo, hi)
        table[lo:hi, MEASURES] = np.round(rng.gamma(2.0, 50.0, (n, 32)), 2)
        table[lo:hi, CODES] = rng.integers(0, 100, (n, CODES.stop - CODES.start)) * (rng.random((n, 1)) < 0.9)
        table[lo:hi, COUNTER] = 0
    return table


def checksums(table):
    """Exact sums, chunk by chunk in a fixed order: equal iff the bytes read back equal."""
    s = np.zeros(2)
    for lo in range(0, len(table), BUILD_ROWS):
        part = table[lo:lo + BUILD_ROWS]
        s += [part[:, MEASURES].sum(), part[:, CODES].sum()]
    return s.tolist()


def run(table, keys, batch, update_pct, seconds, rng, lat_us=None):
    """Batches until `seconds` pass; (batches, rows, updates, group totals)."""
    n_batches = n_rows = n_updates = 0
    groups = np.zeros(100)
    end = time.perf_counter() + seconds
    # Bounded by the deadline: one batch per pass.
    while True:
        idx = keys.take(batch)  # before t0: a refill of the key buffer is not the batch's latency
        t0 = time.perf_counter()
        if t0 >= end:
            break
        sub = table[idx]
        totals = sub[:, MEASURES].sum(axis=1)
        groups += np.bincount(sub[:, CATEGORY].astype(np.int64), weights=totals, minlength=100)[:100]
        if rng.random() * 100 < update_pct:
            rows, counts = np.unique(idx, return_counts=True)
            table[rows, COUNTER] += counts
            n_updates += batch
        n_batches += 1
        n_rows += batch
        if lat_us is not None:
            lat_us.append((time.perf_counter() - t0) * 1e6)
    return n_batches, n_rows, n_updates, groups


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, required=True, help="table bytes")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warm-seconds", type=float, default=20)
    ap.add_argument("--batch", type=int, default=256, help="rows a batch")
    ap.add_argument("--update-pct", type=float, default=5)
    ap.add_argument("--zipf", type=float, default=0.99)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rows = a.size // (COLS * 8)
    t0 = time.perf_counter()
    table = build(rows, a.seed)
    sums0 = checksums(table)
    out = {"job": "numpy", "rows": rows, "build_s": round(time.perf_counter() - t0, 2)}
    keys = KeyStream(Keys(rows, a.zipf, a.seed + 1))
    rng = np.random.default_rng(a.seed + 2)
    _, _, warm_updates, _ = run(table, keys, a.batch, a.update_pct, a.warm_seconds, rng)
    lat = []
    t1 = time.perf_counter()
    batches, done, updates, _ = run(table, keys, a.batch, a.update_pct, a.seconds, rng, lat)
    secs = time.perf_counter() - t1
    lat = np.array(lat)
    out.update({"seconds": round(secs, 2), "ops": done, "ops_per_s": round(done / secs, 1), "batches": batches,
                "p50_us": round(float(np.percentile(lat, 50)), 1), "p99_us": round(float(np.percentile(lat, 99)), 1),
                "p999_us": round(float(np.percentile(lat, 99.9)), 1), "unit": "rows"})
    errors = []
    if not np.array_equal(table[:, 0], np.arange(rows, dtype=np.float64)):
        errors.append("row numbers changed")
    if table[:, COUNTER].sum() != warm_updates + updates:
        errors.append(f"counter sum {table[:, COUNTER].sum():.0f} != {warm_updates + updates} updates")
    if checksums(table) != sums0:
        errors.append("measure or code columns changed")
    out["verified"] = not errors
    out["errors"] = errors
    print(json.dumps(out), flush=True)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
