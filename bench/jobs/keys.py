"""YCSB's ScrambledZipfianGenerator in numpy, the same draws as bench/ycsb_load.c: a zipfian rank
over YCSB's 10^10 items (Gray et al.), hashed onto the records with FNV-1a 64 over its 8 bytes,
so the hot records are scattered over memory rather than packed at its start."""

import numpy as np

ITEMS = 10_000_000_000
ZETAN_099 = 26.46902820178302  # YCSB's ScrambledZipfianGenerator.ZETAN (theta 0.99)
FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(1099511628211)


def zeta(n, theta):
    """sum_{i=1..n} i^-theta: exact up to 10^6, Euler-Maclaurin for the tail (as ycsb_load.c)."""
    m = min(n, 1_000_000)
    s = float(np.sum(np.arange(1, m + 1, dtype=np.float64) ** -theta))
    if n <= m:
        return s
    tail = (n ** (1 - theta) - m ** (1 - theta)) / (1 - theta)
    tail += (n ** -theta - m ** -theta) / 2
    tail += (-theta * n ** (-theta - 1) + theta * m ** (-theta - 1)) / 12
    return s + tail


def fnvhash64(vals):
    """YCSB's Utils.fnvhash64 of each uint64, then Math.abs."""
    h = np.full(vals.shape, FNV_OFFSET, dtype=np.uint64)
    v = vals.astype(np.uint64)
    with np.errstate(over="ignore"):
        for _ in range(8):
            h ^= v & np.uint64(0xFF)
            v >>= np.uint64(8)
            h *= FNV_PRIME
    s = h.view(np.int64)
    return np.abs(s).view(np.uint64)  # abs(INT64_MIN) stays itself, as in Java


class Keys:
    """Record numbers in [0, records) drawn by theta (0: uniform)."""

    def __init__(self, records, theta, seed):
        self.records, self.theta = records, theta
        self.rng = np.random.default_rng(seed)
        if theta:
            self.zetan = ZETAN_099 if theta == 0.99 else zeta(ITEMS, theta)
            self.alpha = 1.0 / (1.0 - theta)
            self.eta = (1 - (2.0 / ITEMS) ** (1 - theta)) / (1 - zeta(2, theta) / self.zetan)
            self.half_pow = 1.0 + 0.5 ** theta

    def draw(self, n):
        if not self.theta:
            return self.rng.integers(0, self.records, n, dtype=np.int64)
        u = self.rng.random(n)
        uz = u * self.zetan
        rank = (ITEMS * (self.eta * u - self.eta + 1) ** self.alpha).astype(np.uint64)
        rank[uz < self.half_pow] = 1
        rank[uz < 1.0] = 0
        return (fnvhash64(rank) % np.uint64(self.records)).astype(np.int64)


class KeyStream:
    """Keys.draw in blocks of BLOCK (a call costs ~250 us whatever its size, a key ~0.2 us), handed
    out `n` at a time."""

    BLOCK = 65536

    def __init__(self, keys):
        self.keys, self.buf, self.at = keys, np.empty(0, dtype=np.int64), 0

    def take(self, n):
        if self.at + n > len(self.buf):
            self.buf, self.at = self.keys.draw(max(self.BLOCK, n)), 0
        self.at += n
        return self.buf[self.at - n:self.at]
