"""memlend: far memory for Python, over libmemlend.so (ctypes, no build step).

A Region is anonymous memory of `size` bytes of which at most `budget` bytes
are resident; the rest lives on donors or in a local SSD file and comes back
on the next touch. Its buffer is writable and zero-copy, so numpy can wrap it:

    import memlend, numpy as np
    with memlend.Region(4 << 30, budget=1 << 30) as r:     # pages on SSD
        a = np.frombuffer(r.buffer, dtype=np.float64)      # no copy
        a[:] = 1.0
        print(a.sum(), r.stats()["pages_written_back"])
        del a                                              # views first

Rules:
  * Views (memoryviews, numpy arrays) keep the memory alive: the region is
    unmapped only when it is closed AND no view is left. close() refuses
    (raises memlend.Error) while views exist; leaving a `with` block with
    views alive warns and defers the unmap to the last view's end.
  * Any thread may touch the memory. A forked child must not: the region is
    not in the child (touching it there is SIGSEGV). exec is fine.
  * A store failure (a donor dies) is SIGBUS in the touching thread, with
    the reason on stderr. MEMLEND_LOG=debug says more.

The library is found via $MEMLEND_LIB (the .so, or a directory holding
it), then ../../target/release (and target/debug) from this package, then
the system loader (libmemlend.so on the library path).
"""

import ctypes
import ctypes.util
import os
import sys
import warnings

__all__ = ["Region", "Error", "version", "API_VERSION", "PAGE_SIZE", "library_path"]

API_VERSION = 1
PAGE_SIZE = 4096
_LIBNAME = "libmemlend.so"


class Error(Exception):
    """A memlend call failed; the message is the library's."""


class _Config(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("insecure", ctypes.c_uint32),
        ("size_bytes", ctypes.c_uint64),
        ("budget_bytes", ctypes.c_uint64),
        ("donors", ctypes.c_char_p),
        ("ssd_path", ctypes.c_char_p),
        ("key_path", ctypes.c_char_p),
        ("evict_batch_pages", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("layers", ctypes.c_char_p),
    ]


_STAT_FIELDS = [
    "page_size",
    "region_pages",
    "budget_pages",
    "faults_zero_filled",
    "faults_from_store",
    "faults_already_mapped",
    "eviction_batches",
    "pages_written_back",
    "pages_zero_dropped",
    "pages_clean_dropped",
    "faults_write_protect",
    "pages_poisoned",
    "pages_resident",
    "remove_events",
    "unmap_events",
    "remap_events",
    "pages_discarded",
    "store_discard_failures",
    "faults_deferred",
]


class _Stats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_uint32)] + [
        (name, ctypes.c_uint64) for name in _STAT_FIELDS
    ]


def _candidates():
    env = os.environ.get("MEMLEND_LIB")
    if env:
        yield os.path.join(env, _LIBNAME) if os.path.isdir(env) else env
        return  # an explicit choice is never second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    for profile in ("release", "debug"):
        yield os.path.normpath(os.path.join(here, "..", "..", "target", profile, _LIBNAME))
    yield ctypes.util.find_library("memlend") or _LIBNAME


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (missing)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError(
        "memlend: cannot load libmemlend.so; build it with `cargo build --release -p "
        "memlend-capi` or set MEMLEND_LIB. Tried: " + "; ".join(tried)
    )


_lib, library_path = _load()

_lib.memlend_config_init.argtypes = [ctypes.POINTER(_Config)]
_lib.memlend_config_init.restype = None
_lib.memlend_region_create.argtypes = [ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.c_size_t]
_lib.memlend_region_create.restype = ctypes.c_void_p
_lib.memlend_region_ptr.argtypes = [ctypes.c_void_p]
_lib.memlend_region_ptr.restype = ctypes.c_void_p
_lib.memlend_region_len.argtypes = [ctypes.c_void_p]
_lib.memlend_region_len.restype = ctypes.c_size_t
_lib.memlend_region_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Stats)]
_lib.memlend_region_stats.restype = ctypes.c_int
_lib.memlend_region_placement.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
_lib.memlend_region_placement.restype = ctypes.c_int
_lib.memlend_region_discard.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
_lib.memlend_region_discard.restype = ctypes.c_int
_lib.memlend_region_destroy.argtypes = [ctypes.c_void_p]
_lib.memlend_region_destroy.restype = ctypes.c_int
_lib.memlend_version.argtypes = []
_lib.memlend_version.restype = ctypes.c_char_p
_lib.memlend_api_version.argtypes = []
_lib.memlend_api_version.restype = ctypes.c_uint32

if _lib.memlend_api_version() != API_VERSION:
    raise ImportError(
        f"memlend: {library_path} speaks API {_lib.memlend_api_version()}, "
        f"this module API {API_VERSION}"
    )


def version():
    """The library's version string."""
    return _lib.memlend_version().decode()


def _errno_text(rc):
    return os.strerror(-rc) if rc < 0 else str(rc)


def _cstr(value, what):
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    value = os.fsencode(value) if not isinstance(value, bytes) else value
    if b"\0" in value:
        raise ValueError(f"{what} contains a NUL byte")
    return value


class _Mapping:
    """Owns the C handle. Every buffer view references it (through the
    ctypes array), so the memory is unmapped only when both the Region let
    go of it and the last view is gone: no view ever outlives the mapping."""

    __slots__ = ("handle", "__weakref__")

    def __init__(self, handle):
        self.handle = handle

    def destroy(self):
        handle, self.handle = self.handle, None
        if handle:
            _lib.memlend_region_destroy(handle)

    def __del__(self):
        # Interpreter shutdown may have torn down the module globals.
        if self.handle and _lib is not None:
            self.destroy()


class Region:
    """Far memory: `size` bytes, at most `budget` of them resident.

    donors  -- "host:port,host:port" or a list of them: pages are striped
               over the donors. None: pages go to a local SSD file.
    ssd     -- with no donors: a new file, a directory (a fresh file is
               made in it) or a block device; None means $MEMLEND_SSD_DIR
               or /var/tmp. The file is unlinked at once.
    key     -- the cluster key file for the donors (mode 0600).
    insecure -- talk to donors that run without a key.
    layers  -- named layers over the store, outermost first: "checksum,stats"
               (known: checksum, crypt, pack, pack-zstd, stats), or None.

    Raises memlend.Error with the library's message if the region cannot be
    made (bad size or budget, unreachable donor, wrong key, no space).
    """

    def __init__(self, size, budget, donors=None, ssd=None, key=None, insecure=False,
                 evict_batch_pages=0, layers=None):
        cfg = _Config()
        _lib.memlend_config_init(ctypes.byref(cfg))
        if int(size) < 0 or int(budget) < 0:
            raise ValueError("size and budget are byte counts, not negative")
        cfg.size_bytes = int(size)
        cfg.budget_bytes = int(budget)
        # Keep the encoded strings referenced until create returns.
        keep = (_cstr(donors, "donors"), _cstr(ssd, "ssd"), _cstr(key, "key"),
                _cstr(layers, "layers"))
        cfg.donors, cfg.ssd_path, cfg.key_path, cfg.layers = keep
        cfg.insecure = 1 if insecure else 0
        cfg.evict_batch_pages = int(evict_batch_pages)
        err = ctypes.create_string_buffer(1024)
        handle = _lib.memlend_region_create(ctypes.byref(cfg), err, len(err))
        if not handle:
            raise Error(err.value.decode(errors="replace"))
        self._mapping = _Mapping(handle)
        self._len = _lib.memlend_region_len(handle)
        self._addr = _lib.memlend_region_ptr(handle)

        # The one object every view is built on: a ctypes array over the
        # mapping, which holds the _Mapping so views keep it alive.
        class _Memory(ctypes.c_ubyte * self._len):
            pass

        self._array = _Memory.from_address(self._addr)
        self._array._owner = self._mapping
        # References to the array when nothing views it: ours and
        # getrefcount's own argument.
        self._idle_refs = sys.getrefcount(self._array)

    @property
    def closed(self):
        return self._array is None

    def _check_open(self):
        if self._array is None:
            raise Error("region is closed")

    @property
    def buffer(self):
        """A writable memoryview (format 'B') over the whole region, no copy.
        numpy.frombuffer(r.buffer, dtype=...) wraps it in place."""
        self._check_open()
        return memoryview(self._array).cast("B")

    @property
    def address(self):
        """Start address of the memory (for ctypes or C extensions; such raw
        uses are not tracked as views)."""
        self._check_open()
        return self._addr

    def __len__(self):
        return self._len

    @property
    def size(self):
        return self._len

    def views(self):
        """How many views (memoryviews, numpy arrays over them, ...) still
        hold the memory."""
        if self._array is None:
            return 0
        return sys.getrefcount(self._array) - self._idle_refs

    def stats(self):
        """The region's counters as a dict (see memlend_stats in memlend.h)."""
        self._check_open()
        st = _Stats()
        st.struct_size = ctypes.sizeof(_Stats)
        rc = _lib.memlend_region_stats(self._mapping.handle, ctypes.byref(st))
        if rc != 0:
            raise Error(f"memlend_region_stats: {_errno_text(rc)}")
        return {name: getattr(st, name) for name in _STAT_FIELDS}

    def discard(self, offset, length):
        """Give back `length` bytes at `offset` (both multiples of PAGE_SIZE):
        the range then reads zero and holds no memory, local or far. Views
        stay valid."""
        self._check_open()
        if offset < 0 or length < 0:
            raise ValueError("offset and length are byte counts, not negative")
        rc = _lib.memlend_region_discard(self._mapping.handle, int(offset), int(length))
        if rc != 0:
            raise Error(
                f"discard {offset:#x}+{length:#x}: {_errno_text(rc)}"
                + (" (whole pages inside the region)" if rc == -22 else "")
            )

    def placement(self):
        """Where the pages go: "donor 10.0.0.2:7070, encrypted", "file /var/tmp/... (unlinked)"."""
        self._check_open()
        buf = ctypes.create_string_buffer(512)
        rc = _lib.memlend_region_placement(self._mapping.handle, buf, len(buf))
        if rc < 0:
            raise Error(f"memlend_region_placement: {_errno_text(rc)}")
        return buf.value.decode(errors="replace")

    def close(self):
        """Unmap the region and release its store now. Raises memlend.Error,
        and leaves the region open, if views of its buffer still exist:
        delete them (or call .release() on memoryviews) first. Idempotent."""
        if self._array is None:
            return
        n = self.views()
        if n > 0:
            raise Error(
                f"region still has {n} view(s) of its buffer (memoryviews or numpy "
                f"arrays); delete them before close()"
            )
        mapping = self._mapping
        self._array = self._mapping = None
        mapping.destroy()

    def _detach(self):
        """Let go of the memory: it is unmapped (by _Mapping.__del__) as soon
        as no view is left, which may be now."""
        self._array = self._mapping = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._array is None:
            return False
        n = self.views()
        if n > 0:
            warnings.warn(
                f"memlend region left its with-block with {n} view(s) alive; "
                "it is unmapped when the last of them goes",
                ResourceWarning,
                stacklevel=2,
            )
        self._detach()
        return False

    def __del__(self):
        if getattr(self, "_array", None) is not None:
            self._detach()

    def __repr__(self):
        state = "closed" if self.closed else f"{self.placement()}"
        return f"<memlend.Region {self._len} bytes, {state}>"
