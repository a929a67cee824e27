//! Core placement: the handler moves to the core of the thread that faults
//! (`cpu.rs`), so that a fault's two hand-offs stay on one core.

use memlend_fault::{Region, RegionConfig};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PAGE_SIZE;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAGES: usize = 4096;

fn allowed_cores() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: a writable cpu_set_t of the size passed; pid 0 is this thread.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0);
    // SAFETY: CPU_ISSET reads inside the set below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

fn pin_this_thread(core: usize) {
    // SAFETY: an all-zero cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `core` comes from the allowed set, below CPU_SETSIZE.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: a valid cpu_set_t of the size passed; pid 0 is this thread.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(rc, 0, "pin to core {core}");
}

/// The core the region's handler thread last ran on, from /proc.
fn handler_core() -> usize {
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        if std::fs::read_to_string(dir.join("comm")).unwrap().trim() != "memlend-fault" {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 1..];
        return after.split_ascii_whitespace().nth(36).unwrap().parse().unwrap();
    }
    panic!("no handler thread");
}

/// Fault pages (zero-fill and store reads: the budget is small) for a while.
fn fault_for(region: &Region, from_page: &mut usize, how_long: Duration) {
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        let page = *from_page % PAGES;
        *from_page += 97;
        let addr = (region.as_ptr() as usize + page * PAGE_SIZE) as *mut u64;
        // SAFETY: an aligned word inside the live region; one thread.
        unsafe { addr.write_volatile(addr.read_volatile() + 1) };
    }
}

#[test]
fn the_handler_follows_the_faulting_thread_from_core_to_core() {
    let cores = allowed_cores();
    if cores.len() < 2 {
        eprintln!("one core allowed: nothing to follow");
        return;
    }
    let store = Arc::new(RamStore::new(PAGES as u64, RamOptions::default()).unwrap());
    let config =
        RegionConfig { size_bytes: PAGES * PAGE_SIZE, budget_pages: 256, evict_batch_pages: 32 };
    let region = Region::new(config, store).unwrap();
    // Each thread of this test binary's harness may be pinned by us: this
    // one is ours alone.
    let mut page = 0;
    for (round, &core) in [cores[0], cores[1], cores[0]].iter().enumerate() {
        pin_this_thread(core);
        fault_for(&region, &mut page, Duration::from_millis(50));
        let moves = region.handler_stats().handler_moves;
        assert!(moves > round as u64, "round {round}: {moves} moves");
        assert_eq!(handler_core(), core, "round {round}");
    }
}
