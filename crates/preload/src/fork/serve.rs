//! The parent's thread that answers a forked child's reads of far pages:
//! from the parent's own memory where that still holds the fork's bytes
//! (`memlend_fault::ParentCopy`), else from the store's snapshot.

use crate::heap::Heap;
use memlend_fault::{serve_link, ParentCopy};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Pages sent to children, and how many of them were copied from the
/// parent's memory, for the report.
pub static PAGES_SENT: AtomicU64 = AtomicU64::new(0);
pub static PAGES_COPIED: AtomicU64 = AtomicU64::new(0);

/// Serve snapshot `id` to the child of the fork paused as `number` on a
/// thread of its own, until the child's end closes; then release the
/// snapshot and set `child_gone`.
pub fn spawn(
    heap: &'static Heap,
    id: u64,
    number: u64,
    parent_end: UnixStream,
    child_gone: Option<Arc<AtomicBool>>,
) {
    let serve = move || {
        let copy = match heap.region.parent_copy(number) {
            Ok(copy) => Some(copy),
            Err(e) => {
                tracing::warn!("fork: the child reads every page from the store ({e})");
                None
            }
        };
        let read = |page: u32, buf: &mut [u8]| {
            if copied(copy.as_ref(), heap, id, page, buf) {
                PAGES_COPIED.fetch_add(1, Relaxed);
                return Ok(());
            }
            let read = heap.snapshots.read_snapshot(id, u64::from(page), buf);
            read.map_err(std::io::Error::other)
        };
        if let Err(e) = serve_link(parent_end, read, &PAGES_SENT) {
            tracing::error!("fork: serving a child's far pages: {e}");
        }
        if let Some(gone) = child_gone {
            gone.store(true, Relaxed);
        }
        heap.snapshots.release(id);
    };
    let spawned = std::thread::Builder::new().name("memlend-fork".into()).spawn(serve);
    if let Err(e) = spawned {
        tracing::error!("fork: no thread to serve the child's far pages: {e}");
        heap.snapshots.release(id);
    }
}

/// Whether page `page` was copied into `buf` from the parent's memory. A
/// page the snapshot cannot answer for (released, given up, not owed) is
/// not: the snapshot's read then says why.
fn copied(copy: Option<&ParentCopy>, heap: &Heap, id: u64, page: u32, buf: &mut [u8]) -> bool {
    let Some(copy) = copy else { return false };
    let unchanged = || heap.snapshots.unchanged(id, u64::from(page)).unwrap_or(false);
    match copy.copy(page, buf, unchanged) {
        Ok(done) => done,
        Err(e) => {
            tracing::debug!("fork: page {page} from the parent's memory: {e}");
            false
        }
    }
}
