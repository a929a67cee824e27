"""CPython + numpy under `memlend run`: arrays several times the local
budget, built, mutated, grown and summed. Prints digests of the results, so
a far-memory run must print exactly what a plain run prints.
Usage: numpy_far.py TOTAL_MIB"""
import hashlib
import sys

import numpy as np

total_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
n = total_mib * (1 << 20) // 8 // 4  # four float64/int64 arrays

a = np.arange(n, dtype=np.int64)
b = (a * 2654435761) % 1000003
c = np.sqrt(b.astype(np.float64))
perm = np.random.default_rng(42).permutation(n)
d = b[perm]  # a random gather over far memory
d.sort()
grown = np.concatenate([a, b])  # realloc-like growth through a new buffer
del a
lists = [bytes(range(256)) * 4096 for _ in range(8)]  # 1 MiB bytes objects

h = hashlib.sha256()
for arr in (b, c, d, grown):
    h.update(arr.tobytes())
for blob in lists:
    h.update(blob)
print("numpy_far", total_mib, "MiB", int(b.sum()), round(float(c.sum()), 3), h.hexdigest())
