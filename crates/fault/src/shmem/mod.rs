//! Shared memory made far, across every process that maps it.
//!
//! A shared anonymous mapping (PostgreSQL's shared buffers) is one set of
//! pages seen by a process and every child it forks. It is made far as a
//! memfd of the same size (`adopt.rs`), registered with a userfaultfd that
//! asks for fork events: each fork gives a new descriptor for the child's
//! copy, registered by the kernel in the fork itself. All of them go to
//! one server (`server.rs`), a thread in `memlend run`'s own process, not
//! the program's: it outlives every process of the program, whichever
//! exits first or is killed.
//!
//! A miss in any process is read from the segment's store and placed in
//! the memfd (UFFDIO_COPY through that process's descriptor, charged to its
//! memory cgroup); every other process then finds the page there. An
//! eviction (`evict.rs`) write-protects its victims in every process,
//! copies them out, and punches a hole, which drops them from all page
//! tables at once (`segment.rs` holds a segment's state, `order.rs` which
//! pages leave first; `link.rs` is the hand-over, `stats.rs` the counters).
//!
//! When the server stops while a process still maps a segment, the far
//! pages come home into the memfd first (`Server::stop`): the segment
//! lives on as ordinary shared memory for as long as anything maps it.

mod adopt;
mod bits;
mod evict;
mod link;
mod order;
mod segment;
mod server;
mod stats;

pub use adopt::{join_shared, map_shared, Mapped};
pub use link::SEGMENT_BYTES_MAX;
pub use server::{OpenStore, Server, ServerConfig, SEGMENTS_MAX};
pub use stats::SharedStats;
