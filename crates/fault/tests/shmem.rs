//! Shared memory far across processes (`shmem/`), on the real kernel: a
//! segment mapped by a process and the children it forks, served by one
//! server whose budget is a fraction of the segment. Every byte read back
//! in any process is the last byte written by any process.

use memlend_fault::shmem::{map_shared, Server, ServerConfig, SharedStats};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, PAGE_SIZE};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

const PAGES: usize = 1024;
const BUDGET_PAGES: u64 = 96;
const WORDS: usize = PAGE_SIZE / 8;

fn pattern(page: usize, w: usize, seed: u64) -> u64 {
    (page as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((w as u64) << 40) ^ seed | 1
}

fn word(base: usize, page: usize, w: usize) -> *mut u64 {
    (base + page * PAGE_SIZE + w * 8) as *mut u64
}

fn fill(base: usize, pages: impl Iterator<Item = usize>, seed: u64) {
    for page in pages {
        for w in 0..WORDS {
            // SAFETY: an aligned word of the live segment.
            unsafe { word(base, page, w).write_volatile(pattern(page, w, seed)) };
        }
    }
}

/// The first page (and word) that differs, if any.
fn check(
    base: usize,
    pages: impl Iterator<Item = usize>,
    seed: impl Fn(usize) -> u64,
) -> Option<(usize, usize)> {
    for page in pages {
        for w in 0..WORDS {
            // SAFETY: as in `fill`.
            if unsafe { word(base, page, w).read_volatile() } != pattern(page, w, seed(page)) {
                return Some((page, w));
            }
        }
    }
    None
}

fn server(name: &str) -> Option<(Server, PathBuf)> {
    if let Err(why) = memlend_fault::check_access() {
        memlend_testskip::skip(&why);
        return None;
    }
    let dir = std::env::temp_dir().join(format!("memlend-shmem-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("shared.sock");
    let config = ServerConfig {
        budget_pages: Arc::new(AtomicU64::new(BUDGET_PAGES)),
        open_store: Box::new(|pages| {
            let store = RamStore::new(pages, RamOptions::default()).map_err(|e| e.to_string())?;
            Ok(Arc::new(store) as Arc<dyn PageStore>)
        }),
        accept_peer: Box::new(|pid| pid == std::process::id()),
    };
    Some((Server::start(&sock, config).unwrap(), sock))
}

/// fork(2) as the bare system call. The server runs in this process here
/// (in `memlend run` it has a process of its own), and glibc's fork holds
/// the allocator's locks across the system call, which waits for the server
/// to read the fork event: a server thread that allocated meanwhile would
/// wait for ever. The children below allocate nothing, so they need none of
/// what glibc's fork sets up.
fn bare_fork() -> i32 {
    // SAFETY: clone with only SIGCHLD is fork: a copy of this process.
    unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0) as i32 }
}

/// Fork; the child runs `body` and exits with its answer.
fn in_child(body: impl FnOnce() -> i32) -> i32 {
    match bare_fork() {
        0 => {
            let code = body();
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) }
        }
        pid => {
            assert!(pid > 0, "fork: {}", std::io::Error::last_os_error());
            let mut status = 0;
            // SAFETY: waits for our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
            libc::WEXITSTATUS(status)
        }
    }
}

#[test]
fn a_segment_larger_than_its_budget_keeps_every_byte_across_forks() {
    let Some((server, sock)) = server("forks") else { return };
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let base = map_shared(&sock, PAGES * PAGE_SIZE, rw).unwrap().addr;
    fill(base, 0..PAGES, 1);
    assert_eq!(check(base, 0..PAGES, |_| 1), None, "the maker reads back what it wrote");
    let stats = &server.stats;
    assert!(SharedStats::get(&stats.evicted_pages) >= (PAGES as u64 - BUDGET_PAGES));
    assert!(SharedStats::get(&stats.resident_pages) <= BUDGET_PAGES);

    // A child sees every page as the parent wrote it, and rewrites the
    // odd ones; the parent then sees the child's writes.
    let code = in_child(|| {
        if check(base, 0..PAGES, |_| 1).is_some() {
            return 1;
        }
        fill(base, (0..PAGES).filter(|p| p % 2 == 1), 2);
        0
    });
    assert_eq!(code, 0, "the child read back what the parent wrote");
    let seed = |p: usize| if p % 2 == 1 { 2 } else { 1 };
    assert_eq!(check(base, 0..PAGES, seed), None, "the parent sees the child's writes");

    // Two children at once, each writing its own half while reading the
    // other's: a grandchild's writes too.
    let code = in_child(|| {
        let inner = in_child(|| {
            fill(base, (0..PAGES).filter(|p| p % 4 == 0), 3);
            0
        });
        fill(base, (0..PAGES).filter(|p| p % 4 == 2), 4);
        inner
    });
    assert_eq!(code, 0);
    let seed = |p: usize| match p % 4 {
        0 => 3,
        2 => 4,
        _ => 2,
    };
    assert_eq!(check(base, 0..PAGES, seed), None, "every process's last write holds");
    assert!(SharedStats::get(&stats.store_reads) > 0);
    assert_eq!(SharedStats::get(&stats.pages_poisoned), 0);
    assert!(SharedStats::get(&stats.resident_pages) <= BUDGET_PAGES);
    server.stop();
    // Stopped while mapped here: the far pages came home.
    assert_eq!(check(base, 0..PAGES, seed), None, "nothing lost when the server lets go");
}

#[test]
fn a_server_that_is_not_there_leaves_nothing_mapped() {
    let dir = std::env::temp_dir();
    let sock = dir.join(format!("memlend-shmem-none-{}.sock", std::process::id()));
    let err = map_shared(&sock, 16 * PAGE_SIZE, libc::PROT_READ | libc::PROT_WRITE).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
}

/// A write racing an eviction of its page is never lost: a child counts in
/// its pages while the parent sweeps the rest, evicting the child's pages
/// again and again under its writes, until the parent says stop (in a
/// control page the sweeps leave alone).
#[test]
fn writes_racing_evictions_all_land() {
    let Some((server, sock)) = server("race") else { return };
    const HOT: usize = 64;
    const SWEEPS: u64 = 4;
    const ROUNDS_MAX: u64 = 1 << 20;
    let control = PAGES - 1;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let base = map_shared(&sock, PAGES * PAGE_SIZE, rw).unwrap().addr;
    let (stop, rounds) = (word(base, control, 0), word(base, control, 1));
    let pid = bare_fork();
    if pid == 0 {
        let mut done = 0;
        // SAFETY: an aligned word of the segment, written by the parent.
        while unsafe { stop.read_volatile() } == 0 && done < ROUNDS_MAX {
            for page in 0..HOT {
                let w = word(base, page, page % WORDS);
                // SAFETY: an aligned word whose only writer is this child.
                unsafe { w.write_volatile(w.read_volatile() + 1) };
            }
            done += 1;
        }
        // SAFETY: as above; only the child writes it.
        unsafe { rounds.write_volatile(done) };
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(0) };
    }
    assert!(pid > 0);
    for sweep in 0..SWEEPS {
        fill(base, HOT..control, sweep);
    }
    // SAFETY: the parent's flag word.
    unsafe { stop.write_volatile(1) };
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status:#x}");
    // SAFETY: the child is gone; we read what it wrote.
    let rounds = unsafe { rounds.read_volatile() };
    assert!(rounds > 0 && rounds < ROUNDS_MAX, "the child counted {rounds} rounds");
    for page in 0..HOT {
        // SAFETY: as above.
        let n = unsafe { word(base, page, page % WORDS).read_volatile() };
        assert_eq!(n, rounds, "page {page}: {n} of {rounds} writes landed");
    }
    assert!(SharedStats::get(&server.stats.evicted_pages) >= SWEEPS * (PAGES - HOT) as u64 / 2);
    server.stop();
}
