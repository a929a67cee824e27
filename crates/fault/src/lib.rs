//! Far-memory regions: anonymous memory whose pages live partly in a
//! [`memlend_store::PageStore`], faulted in on demand through userfaultfd.
//!
//! A [`Region`] keeps at most `budget_pages` of its pages mapped. One handler
//! thread answers every fault: a page never written out is zero-filled with no
//! store I/O; a page evicted earlier is read from the store (one `read`) and
//! mapped with UFFDIO_COPY. Before a fault would exceed the budget, a batch of
//! the oldest pages is moved out of the region (UFFDIO_MOVE, so no write can
//! slip in unseen) and its dirty pages are written to the store in one
//! `write`. Pages read back from the store are mapped write-protected; until
//! a write faults on one (userfaultfd WP), the store's copy is current and
//! eviction drops the page with no write.
//!
//! Each part is a room of its own (a folder): `kernel/` (the system calls),
//! `handler/` (the loop and one fault), `evict/`, `prefetch/`, `zpool/`
//! (the compressed tier), `fork/` and `shmem/` (shared memory, served
//! across processes). See DESIGN.md beside this crate and
//! docs/architecture.md.

mod discards;
mod error;
mod evict;
mod fences;
mod fork;
mod handler;
mod huge;
mod intent;
mod kernel;
mod latency;
#[cfg(test)]
mod policy_tests;
mod prefetch;
mod region;
mod reserve;
mod shared;
pub mod shmem;
mod state;
mod stats;
pub mod trace;
mod zpool;

pub use error::{FaultError, Result};
pub use fork::child::link::{serve_link, LinkSource};
pub use fork::child::serve::{serve_child, ChildRegion, Discarded};
pub use fork::child::source::{ChildSource, LINK_PAGES_MAX};
pub use fork::copy::ParentCopy;
pub use fork::lazy::ForkWritten;
pub use kernel::uffd::check_access;
pub use memlend_store::codec::{Codec, ZSTD_LEVEL};
pub use region::{Paused, Region, RegionConfig, Tuning, BUDGET_FLOOR_PAGES};
pub use state::{PageState, PageTable, Policy, METADATA_BYTES_PER_PAGE};
pub use stats::{DetailedStats, HandlerStats, RegionStats};
pub use zpool::PoolStats;
