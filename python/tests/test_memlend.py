"""Tests for the memlend Python module, run by crates/capi/tests/python.rs
(so `cargo test --workspace` runs them) or by hand:

    cargo build --release -p memlend-capi
    PYTHONPATH=python /usr/bin/python3 python/tests/test_memlend.py -v

MEMLEND_TEST_DONOR=host:port adds the tests against a keyless donor.
"""

import gc
import os
import sys
import tempfile
import unittest
import warnings
import weakref

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import memlend  # noqa: E402

try:
    import numpy as np
except ImportError:  # the harness says so loudly; the rest still runs
    np = None

MiB = 1 << 20
DONOR = os.environ.get("MEMLEND_TEST_DONOR")


def expected_sum(n, mul, add):
    """sum(i * mul + add for i in range(n)), mod 2**64 as numpy sums uint64."""
    return (mul * n * (n - 1) // 2 + add * n) % (1 << 64)


class Base(unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.dir = self._dir.name

    def tearDown(self):
        gc.collect()
        self._dir.cleanup()


@unittest.skipIf(np is None, "numpy is not installed")
class NumpyOnFarMemory(Base):
    def fill_sum_and_shuffle(self, r, budget):
        n = len(r) // 8
        a = np.frombuffer(r.buffer, dtype=np.uint64)
        # Zero-copy: numpy's data pointer is the region itself.
        self.assertEqual(a.ctypes.data, r.address)
        self.assertEqual(a.size, n)
        self.assertTrue(a.flags.writeable)
        # Fill in chunks (a whole np.arange would be a second copy in RAM).
        chunk = 1 << 20
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            a[lo:hi] = np.arange(lo, hi, dtype=np.uint64) * 3 + 7
        self.assertEqual(int(a.sum(dtype=np.uint64)), expected_sum(n, 3, 7))
        # Whole pages in a random permutation: each row is one page.
        per_page = memlend.PAGE_SIZE // 8
        pages = a.reshape(-1, per_page)
        order = np.random.default_rng(7).permutation(pages.shape[0])
        got = pages[order]
        want = (order[:, None].astype(np.uint64) * per_page
                + np.arange(per_page, dtype=np.uint64)) * 3 + 7
        self.assertTrue(np.array_equal(got, want), "pages read in random order differ")
        # Writes through numpy are visible through the buffer, and back.
        a[5] = 0xDEADBEEF
        self.assertEqual(int.from_bytes(r.buffer[40:48], "little"), 0xDEADBEEF)
        r.buffer[40:48] = (42).to_bytes(8, "little")
        self.assertEqual(int(a[5]), 42)
        # Give the second half back: zeroes there, the first half intact.
        half = len(r) // 2
        r.discard(half, len(r) - half)
        self.assertEqual(int(np.count_nonzero(a[n // 2:])), 0)
        # a[5] was 5 * 3 + 7 = 22 and is 42 now.
        want_half = expected_sum(n // 2, 3, 7) - 22 + 42
        self.assertEqual(int(a[: n // 2].sum(dtype=np.uint64)), want_half)
        del a, pages, got
        st = r.stats()
        self.assertGreater(st["pages_discarded"], 0, st)
        self.assertGreater(st["pages_written_back"], 0, st)
        self.assertGreater(st["faults_from_store"], 0, st)
        self.assertGreater(st["eviction_batches"], 0, st)
        self.assertLessEqual(st["pages_resident"], budget // memlend.PAGE_SIZE, st)
        self.assertEqual(st["pages_poisoned"], 0, st)
        return st

    def test_array_four_times_the_budget_on_ssd(self):
        size, budget = 64 * MiB, 16 * MiB
        with memlend.Region(size, budget, ssd=self.dir) as r:
            self.assertTrue(r.placement().startswith("file "), r.placement())
            st = self.fill_sum_and_shuffle(r, budget)
            self.assertEqual(st["region_pages"], size // memlend.PAGE_SIZE)
        self.assertEqual(os.listdir(self.dir), [], "the SSD file is unlinked")

    def test_named_layers_over_an_ssd_keep_every_page(self):
        with memlend.Region(32 * MiB, 8 * MiB, ssd=self.dir, layers="checksum,crypt") as r:
            self.assertTrue(r.placement().endswith(", layers checksum,crypt"), r.placement())
            self.fill_sum_and_shuffle(r, 8 * MiB)

    @unittest.skipUnless(DONOR, "MEMLEND_TEST_DONOR is not set")
    def test_array_four_times_the_budget_on_a_donor(self):
        with memlend.Region(32 * MiB, 8 * MiB, donors=[DONOR], insecure=True) as r:
            self.assertEqual(r.placement(), f"donor {DONOR}, encrypted")
            self.fill_sum_and_shuffle(r, 8 * MiB)

    def test_threads_fault_at_once(self):
        import threading
        with memlend.Region(32 * MiB, 4 * MiB, ssd=self.dir) as r:
            a = np.frombuffer(r.buffer, dtype=np.uint32)
            parts = np.array_split(np.arange(a.size), 4)

            def fill(k):
                lo, hi = int(parts[k][0]), int(parts[k][-1]) + 1
                for _ in range(2):  # numpy drops the GIL for big copies
                    a[lo:hi] = k + 1

            threads = [threading.Thread(target=fill, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for k, idx in enumerate(parts):
                self.assertTrue(bool((a[int(idx[0]):int(idx[-1]) + 1] == k + 1).all()))
            del a
            st = r.stats()
            self.assertLessEqual(st["pages_resident"], st["budget_pages"])
            self.assertGreater(st["pages_written_back"], 0)

    def test_close_refuses_while_numpy_views_live(self):
        r = memlend.Region(4 * MiB, 1 * MiB, ssd=self.dir)
        a = np.frombuffer(r.buffer, dtype=np.uint8)
        a[:] = 9
        self.assertEqual(r.views(), 1)
        with self.assertRaisesRegex(memlend.Error, "view"):
            r.close()
        self.assertFalse(r.closed)
        self.assertEqual(int(a[-1]), 9, "still mapped after the refusal")
        b = a[100:200]  # a numpy view of the view: same buffer export
        del a
        with self.assertRaises(memlend.Error):
            r.close()
        del b
        r.close()
        self.assertTrue(r.closed)
        r.close()  # idempotent

    def test_leaving_a_with_block_with_views_defers_the_unmap(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with memlend.Region(4 * MiB, 1 * MiB, ssd=self.dir) as r:
                mapping = weakref.ref(r._mapping)
                a = np.frombuffer(r.buffer, dtype=np.uint32)
                a[:] = 0xABCD
        self.assertTrue(any(issubclass(w.category, ResourceWarning) for w in caught))
        self.assertTrue(r.closed)
        # The view still works: the memory lives as long as it does.
        self.assertEqual(int(a.sum()), 0xABCD * a.size)
        self.assertIsNotNone(mapping())
        del a
        self.assertIsNone(mapping(), "unmapped with the last view")

    def test_a_dropped_region_lives_on_in_its_views(self):
        r = memlend.Region(4 * MiB, 1 * MiB, ssd=self.dir)
        a = np.frombuffer(r.buffer, dtype=np.uint16)
        a[:] = 3
        mapping = weakref.ref(r._mapping)
        del r
        gc.collect()
        self.assertEqual(int(a.sum()), 3 * a.size)
        del a
        self.assertIsNone(mapping())


class Buffer(Base):
    def test_buffer_is_a_writable_byte_view(self):
        with memlend.Region(1 * MiB, 256 * 1024, ssd=self.dir) as r:
            mv = r.buffer
            self.assertEqual((mv.format, mv.itemsize, mv.readonly), ("B", 1, False))
            self.assertEqual(mv.nbytes, 1 * MiB)
            mv[0:5] = b"hello"
            mv[-3:] = b"end"
            self.assertEqual(bytes(r.buffer[0:5]), b"hello")
            self.assertEqual(bytes(r.buffer[-3:]), b"end")
            # A slice of a view is a view too: close() sees it.
            part = mv[4096:8192]
            mv.release()
            with self.assertRaises(memlend.Error):
                r.close()
            part.release()
            r.close()
            with self.assertRaisesRegex(memlend.Error, "closed"):
                r.buffer

    def test_stats_are_a_dict_of_counters(self):
        with memlend.Region(2 * MiB, 1 * MiB, ssd=self.dir) as r:
            mv = r.buffer
            for off in range(0, len(mv), memlend.PAGE_SIZE):
                mv[off] = 1
            del mv
            st = r.stats()
        # Written in order, fresh pages are zero-filled a window ahead: far
        # fewer faults than pages (512 before zero-fill ahead).
        self.assertGreater(st["faults_zero_filled"], 0)
        self.assertLess(st["faults_zero_filled"], 512 // 8)
        self.assertEqual(st["budget_pages"], 256)
        self.assertLessEqual(st["pages_resident"], 256)
        self.assertEqual(st["page_size"], memlend.PAGE_SIZE)

    def test_discard_checks_its_range(self):
        with memlend.Region(1 * MiB, 256 * 1024, ssd=self.dir) as r:
            r.buffer[0:4] = b"keep"
            r.buffer[8192:8196] = b"gone"
            r.discard(8192, 4096)
            self.assertEqual(bytes(r.buffer[8192:8196]), b"\0\0\0\0")
            self.assertEqual(bytes(r.buffer[0:4]), b"keep")
            with self.assertRaisesRegex(memlend.Error, "whole pages"):
                r.discard(1, 4096)
            with self.assertRaises(memlend.Error):
                r.discard(0, 2 * MiB)
            with self.assertRaises(ValueError):
                r.discard(-4096, 4096)

    def test_version(self):
        self.assertTrue(memlend.version())
        self.assertTrue(os.path.exists(memlend.library_path) or "/" not in memlend.library_path)


class Errors(Base):
    def test_zero_budget_is_refused(self):
        with self.assertRaisesRegex(memlend.Error, "budget_bytes is 0"):
            memlend.Region(4 * MiB, 0, ssd=self.dir)

    def test_unreachable_donor_is_named(self):
        with self.assertRaisesRegex(memlend.Error, r"127\.0\.0\.1:1\b"):
            memlend.Region(4 * MiB, 1 * MiB, donors="127.0.0.1:1", insecure=True)

    def test_an_unknown_layer_is_refused_with_the_known_ones(self):
        with self.assertRaisesRegex(memlend.Error, r"\"zip\" is not a layer \(known: checksum"):
            memlend.Region(4 * MiB, 1 * MiB, ssd=self.dir, layers="zip")

    def test_donors_without_key_or_insecure_are_refused(self):
        with self.assertRaisesRegex(memlend.Error, "key"):
            memlend.Region(4 * MiB, 1 * MiB, donors="127.0.0.1:1")

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            memlend.Region(-1, 4096)
        with self.assertRaises(ValueError):
            memlend.Region(4096, 4096, ssd="a\0b")
        with self.assertRaisesRegex(memlend.Error, "not both"):
            memlend.Region(4096, 4096, donors="127.0.0.1:1", ssd=self.dir, insecure=True)


if __name__ == "__main__":
    unittest.main()
