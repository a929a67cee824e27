//! Exports: what a client can pick by name, and the shared state behind one.

use memlend_store::page_locks::PageLocks;
use memlend_store::{Caps, PageStore, PAGE_SIZE};
use memlend_wire::nbd::{tx_flags, STRING_BYTES_MAX};
use parking_lot::RwLockWriteGuard;
use std::io;
use std::sync::Arc;

/// One export as configured: a named page store.
#[derive(Clone)]
pub struct Export {
    /// The name clients ask for. The first export of `serve` is also served
    /// for the empty name.
    pub name: String,
    /// Shown by `nbdinfo` and `OPT_LIST`.
    pub description: String,
    /// All connections to this export share this store.
    pub store: Arc<dyn PageStore>,
    /// Refuse WRITE, TRIM and WRITE_ZEROES with EPERM.
    pub read_only: bool,
}

impl Export {
    pub fn new(name: impl Into<String>, store: Arc<dyn PageStore>) -> Self {
        Export { name: name.into(), description: String::new(), store, read_only: false }
    }

    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }
}

/// An export being served: the configuration plus what every connection to
/// it shares (the store and the read-modify-write locks).
pub(crate) struct ExportState {
    pub name: String,
    pub description: String,
    pub store: Arc<dyn PageStore>,
    pub read_only: bool,
    pub size_bytes: u64,
    pub caps: Caps,
    /// Serialise read-modify-write of partial pages; only sub-page writes
    /// take them, so contention is rare.
    rmw_locks: PageLocks,
}

impl ExportState {
    pub fn new(e: Export) -> io::Result<Self> {
        let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
        if e.name.len() > STRING_BYTES_MAX || e.description.len() > STRING_BYTES_MAX {
            return Err(invalid(format!(
                "export {:?}: name or description over 4096 bytes",
                e.name
            )));
        }
        let info = e.store.info();
        let size_bytes = info.pages.checked_mul(PAGE_SIZE as u64).ok_or_else(|| {
            invalid(format!("export {:?}: {} pages overflow", e.name, info.pages))
        })?;
        Ok(ExportState {
            name: e.name,
            description: e.description,
            store: e.store,
            read_only: e.read_only,
            size_bytes,
            caps: info.caps,
            rmw_locks: PageLocks::new(),
        })
    }

    /// Transmission flags for a client that did (or did not) negotiate
    /// structured replies. Every connection shares the store and each reply
    /// is sent after its operation completed, so multi-conn is safe.
    pub fn tx_flags(&self, structured: bool) -> u16 {
        let mut f = tx_flags::HAS_FLAGS
            | tx_flags::SEND_FLUSH
            | tx_flags::SEND_FUA
            | tx_flags::CAN_MULTI_CONN
            | tx_flags::SEND_CACHE;
        if self.read_only {
            f |= tx_flags::READ_ONLY;
        } else {
            f |= tx_flags::SEND_TRIM | tx_flags::SEND_WRITE_ZEROES | tx_flags::SEND_FAST_ZERO;
        }
        if structured {
            f |= tx_flags::SEND_DF;
        }
        f
    }

    /// The lock for read-modify-write of `page`. Hold at most one at a time.
    pub fn lock_page(&self, page: u64) -> RwLockWriteGuard<'_, ()> {
        self.rmw_locks.write_page(page)
    }
}
