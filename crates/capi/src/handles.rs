//! The live regions, by id. C holds ids, never pointers into Rust memory,
//! so a stale or made-up handle is found out by a lookup, not by a crash.
//! Ids are never reused.
//!
//! A forked child inherits a copy of the table but not the handler threads:
//! in it every inherited handle reads as not live (`-EBADF`), so a child
//! can neither reach the region nor try to join a thread it does not have.

use memlend_fault::Region;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub struct Handle {
    pub region: Region,
    pub budget_pages: u64,
    pub describe: String,
    /// The process that made the region.
    pub pid: u32,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);
static LIVE: Mutex<Option<HashMap<usize, Arc<Handle>>>> = Mutex::new(None);

fn live() -> MutexGuard<'static, Option<HashMap<usize, Arc<Handle>>>> {
    // A panic while holding the lock leaves the map consistent (every
    // update is one insert or remove), so a poisoned lock is still usable.
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ids are 0x1000_0000, 0x1000_0010, ...: never 0 (NULL), aligned like
/// pointers, and unlike any small integer passed by mistake.
pub fn insert(h: Handle) -> usize {
    let id = 0x1000_0000 + NEXT.fetch_add(1, Ordering::Relaxed) * 16;
    live().get_or_insert_with(HashMap::new).insert(id, Arc::new(h));
    id
}

pub fn get(id: usize) -> Option<Arc<Handle>> {
    live().as_ref()?.get(&id).filter(|h| h.pid == std::process::id()).cloned()
}

pub fn remove(id: usize) -> Option<Arc<Handle>> {
    let mut live = live();
    let table = live.as_mut()?;
    if table.get(&id)?.pid != std::process::id() {
        return None;
    }
    table.remove(&id)
}
