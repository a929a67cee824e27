//! What the shim saw of the process's large memory, by kind: what it made
//! far (adopted) and what it handed to the kernel as asked (passed), so
//! that `memlend run`'s summary says where memory went instead of "no
//! process made a large allocation" when it went where memlend could not
//! follow (PostgreSQL's shared buffers, a JVM's reserved heap).
//!
//! Adopted kinds are counted only (atomics). A commit in place is counted
//! apart: its bytes lie in a reservation already counted. A passed kind, and the far
//! heap's start, also write `<stats dir>/<pid>.seen.json` at once: a process
//! the OOM killer ends never runs its exit report, and its memory is what
//! the summary must account for most.

use crate::far;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// A kind of large memory the shim sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Adopted: malloc, calloc, realloc, posix_memalign and the rest.
    Malloc,
    /// Adopted: an anonymous private read-write mmap.
    Private,
    /// Adopted: a PROT_NONE reservation, committed later (`reserve.rs`).
    Reserved,
    /// Adopted: a MAP_FIXED commit (or uncommit) into far memory, done in
    /// place (`reserve.rs`); its bytes are in a reservation's already.
    Committed,
    /// Adopted: a shared anonymous mapping, served by `memlend run`'s
    /// shared-memory server in every process that maps it (`shared.rs`).
    SharedFar,
    /// Passed: shared memory (MAP_SHARED anonymous, or a tmpfs or memfd
    /// file: POSIX shm, `memfd_create`).
    Shared,
    /// Passed: an anonymous reservation made PROT_NONE, to be committed
    /// later (a JVM heap, a Go or V8 arena), that the far heap had no room
    /// for.
    ReservedLocal,
    /// Passed: an anonymous mapping placed with MAP_FIXED (a commit into a
    /// reservation), or with flags the far heap does not take.
    Placed,
    /// Passed: an anonymous private mmap the far heap had no room for (full,
    /// not made, or a forked child's).
    NoRoom,
}

const KINDS: [Kind; 9] = [
    Kind::Malloc,
    Kind::Private,
    Kind::Reserved,
    Kind::Committed,
    Kind::SharedFar,
    Kind::Shared,
    Kind::ReservedLocal,
    Kind::Placed,
    Kind::NoRoom,
];

impl Kind {
    /// The key in the reports: `seen_<name>_maps`, `seen_<name>_bytes`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Malloc => "malloc",
            Kind::Private => "private",
            Kind::Reserved => "reserved",
            Kind::Committed => "committed",
            Kind::SharedFar => "shared_far",
            Kind::Shared => "shared",
            Kind::ReservedLocal => "reserved_local",
            Kind::Placed => "placed",
            Kind::NoRoom => "no_room",
        }
    }
}

impl Kind {
    /// Handed to the kernel as asked, not made far.
    pub fn passed(self) -> bool {
        matches!(self, Kind::Shared | Kind::ReservedLocal | Kind::Placed | Kind::NoRoom)
    }
}

struct Tally {
    maps: AtomicU64,
    bytes: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // a template for the array
const ZERO: Tally = Tally { maps: AtomicU64::new(0), bytes: AtomicU64::new(0) };
static TALLIES: [Tally; KINDS.len()] = [ZERO; KINDS.len()];

/// One writer of the seen file at a time; a writer that finds it busy
/// leaves it to the one writing (whose numbers include its own or are
/// rewritten by the next sighting or the exit report).
static WRITING: Mutex<()> = Mutex::new(());

/// A kind's counters: `KINDS` lists the kinds in their declared order, so a
/// kind's discriminant is its place (checked by a test). No search: this is
/// on every large allocation's path.
fn tally(kind: Kind) -> &'static Tally {
    &TALLIES[kind as usize]
}

/// Count a large mapping of `kind`; a passed one is written down at once.
pub fn saw(kind: Kind, bytes: usize) {
    let t = tally(kind);
    t.maps.fetch_add(1, Relaxed);
    t.bytes.fetch_add(bytes as u64, Relaxed);
    if kind.passed() {
        write_file();
    }
}

/// The far heap started: say so where a killed process still leaves it.
pub fn heap_started() {
    write_file();
}

/// The counters as JSON members, each followed by a comma (for the exit
/// report and the seen file alike).
pub fn json_members() -> String {
    let mut j = String::new();
    for kind in KINDS {
        let t = tally(kind);
        let _ = write!(
            j,
            "\"seen_{0}_maps\":{1},\"seen_{0}_bytes\":{2},",
            kind.name(),
            t.maps.load(Relaxed),
            t.bytes.load(Relaxed)
        );
    }
    j
}

fn write_file() {
    let Some(dir) = far::stats_dir() else { return };
    let Ok(_one) = WRITING.try_lock() else { return };
    let pid = std::process::id();
    let heap = far::any_heap().is_some();
    let j = format!("{{\"pid\":{pid},\"far_heap\":{heap},{}\"v\":1}}", json_members());
    // Written beside, then renamed: the summary never reads half a file.
    let tmp = dir.join(format!(".{pid}.seen.json"));
    if std::fs::write(&tmp, j).is_ok() {
        let _ = std::fs::rename(&tmp, dir.join(format!("{pid}.seen.json")));
    }
}

/// Of a large mmap the far heap did not take: its kind, or None if it is no
/// process memory of ours to speak of (a file's pages, the kernel's to
/// drop, or a huge-page mapping).
pub fn kind_of_passed(prot: i32, flags: i32, fd: i32) -> Option<Kind> {
    if flags & libc::MAP_HUGETLB != 0 {
        return None;
    }
    let anonymous = flags & libc::MAP_ANONYMOUS != 0;
    let kind = crate::sys::map_type(flags);
    let shared = kind == libc::MAP_SHARED || kind == libc::MAP_SHARED_VALIDATE;
    if shared {
        return (anonymous || is_shmem(fd)).then_some(Kind::Shared);
    }
    if !anonymous {
        return None;
    }
    if prot == libc::PROT_NONE {
        return Some(Kind::ReservedLocal);
    }
    let placed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
    Some(if placed { Kind::Placed } else { Kind::NoRoom })
}

/// Is `fd` a file in shared memory (tmpfs: POSIX shm, memfd)?
fn is_shmem(fd: i32) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    if fd < 0 {
        return false;
    }
    // SAFETY: a zeroed statfs is a valid out-parameter for fstatfs.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is ours to write; a bad `fd` is an error, not UB.
    let rc = unsafe { libc::fstatfs(fd, &mut st) };
    rc == 0 && st.f_type as i64 == TMPFS_MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;
    use libc::{MAP_ANONYMOUS as ANON, MAP_FIXED, MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE};

    #[test]
    fn kinds_by_what_the_mapping_is() {
        let rw = PROT_READ | PROT_WRITE;
        assert_eq!(kind_of_passed(rw, MAP_SHARED | ANON, -1), Some(Kind::Shared));
        let validate = libc::MAP_SHARED_VALIDATE | ANON;
        assert_eq!(kind_of_passed(rw, validate, -1), Some(Kind::Shared));
        let noreserve = MAP_PRIVATE | ANON | libc::MAP_NORESERVE;
        assert_eq!(kind_of_passed(libc::PROT_NONE, noreserve, -1), Some(Kind::ReservedLocal));
        assert_eq!(
            kind_of_passed(libc::PROT_NONE, MAP_PRIVATE | ANON, -1),
            Some(Kind::ReservedLocal)
        );
        assert_eq!(kind_of_passed(rw, MAP_PRIVATE | ANON | MAP_FIXED, -1), Some(Kind::Placed));
        assert_eq!(kind_of_passed(rw, MAP_PRIVATE | ANON, -1), Some(Kind::NoRoom));
        let hugetlb = MAP_PRIVATE | ANON | libc::MAP_HUGETLB;
        assert_eq!(kind_of_passed(rw, hugetlb, -1), None);
        let file = std::fs::File::open("/proc/self/status").expect("open");
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        assert_eq!(kind_of_passed(PROT_READ, MAP_SHARED, fd), None, "a file's pages");
    }

    #[test]
    fn a_memfd_is_shared_memory() {
        // SAFETY: a NUL-terminated name; the descriptor is closed below.
        let fd = unsafe { libc::memfd_create(c"seen-test".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create");
        let rw = PROT_READ | PROT_WRITE;
        assert_eq!(kind_of_passed(rw, MAP_SHARED, fd), Some(Kind::Shared));
        // SAFETY: ours, opened above.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn kinds_are_listed_in_their_declared_order() {
        for (i, kind) in KINDS.iter().enumerate() {
            assert_eq!(*kind as usize, i, "{kind:?}");
        }
    }

    #[test]
    fn the_members_name_every_kind() {
        saw(Kind::ReservedLocal, 4096);
        let j = format!("{{{}\"v\":1}}", json_members());
        let v: serde_json::Value = serde_json::from_str(&j).expect("json");
        for kind in KINDS {
            assert!(v[format!("seen_{}_bytes", kind.name())].is_u64(), "{j}");
        }
        assert!(v["seen_reserved_local_bytes"].as_u64() >= Some(4096));
    }
}
