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
//! The `unsafe` code is at two edges: `uffd` (the userfaultfd ioctls) and
//! `mem` (mmap, madvise, munmap). See DESIGN.md beside this crate.

mod batch;
mod child;
mod child_cache;
mod child_link;
mod cpu;
mod discards;
mod doorbell;
mod error;
mod events;
mod evict;
mod failsafe;
mod fetch;
mod fork_clean;
mod fork_copy;
mod fork_lazy;
mod handler;
mod huge;
mod intent;
mod latency;
mod mem;
mod moveout;
mod page_bits;
mod pause;
#[cfg(test)]
mod policy_tests;
mod prefetch;
mod read_block;
mod region;
mod reserve;
mod resolve;
mod shared;
mod state;
mod stats;
pub mod trace;
mod trend;
mod uffd;
mod unshare;
mod write_failures;
mod writeback;
mod zpool;

pub use child::{serve_child, ChildRegion, ChildSource, Discarded};
pub use child_link::{serve_link, LinkSource, LINK_PAGES_MAX};
pub use error::{FaultError, Result};
pub use fork_copy::ParentCopy;
pub use fork_lazy::ForkWritten;
pub use memlend_store::codec::{Codec, ZSTD_LEVEL};
pub use region::{Paused, Region, RegionConfig, Tuning, BUDGET_FLOOR_PAGES};
pub use state::{PageState, PageTable, Policy, METADATA_BYTES_PER_PAGE};
pub use stats::{DetailedStats, HandlerStats, RegionStats};
pub use uffd::check_access;
pub use zpool::PoolStats;
