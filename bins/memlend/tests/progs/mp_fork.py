"""multiprocessing with the fork start method under `memlend run`: the
parent builds arrays and a long list several times the local budget, forks
a pool, and the workers read slices of what they inherited (and grow the
inherited list, which reallocs a far block of the parent's) while the
parent rewrites its arrays. Prints digests, so a far-memory run must print
exactly what a plain run prints.
Usage: mp_fork.py TOTAL_MIB"""
import hashlib
import multiprocessing as mp
import sys

import numpy as np

total_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
n = total_mib * (1 << 20) // 8 // 2  # two int64 arrays
WORKERS = 3
a = np.arange(n, dtype=np.int64) * 2654435761 % 1000003
b = a[::-1] * 3 + 1  # a second array, sequentially made
items = list(range(n // 8))  # its pointer array is a far malloc block


def work(k):
    lo, hi = k * n // WORKERS, (k + 1) * n // WORKERS
    h = hashlib.sha256(a[lo:hi].tobytes())
    h.update(b[lo:hi].tobytes())
    before = len(items)  # a worker may take two tasks: its list grows twice
    items.extend(range(1000))  # realloc of the parent's block, in the child
    grew = len(items) == before + 1000 and items[n // 8 - 1] == n // 8 - 1 and items[-1] == 999
    return k, int(a[lo:hi].sum()), int(b[lo:hi].sum()), grew, h.hexdigest()


if __name__ == "__main__":
    ctx = mp.get_context("fork")
    with ctx.Pool(WORKERS) as pool:
        pending = pool.map_async(work, range(WORKERS))
        a[:] = -1  # the children must see the arrays as at the fork
        b[:] = -2
        results = sorted(pending.get(timeout=300))
    for r in results:
        print("mp_fork", *r)
    print("mp_fork parent", int(a.sum()), int(b.sum()), len(items))
