//! The kernel's interfaces, and the only `unsafe` code of the crate: the
//! userfaultfd and its ioctls (`kernel/uffd.rs`), mmap, madvise and munmap
//! (`kernel/mem.rs`), the eventfd the handler polls beside the userfaultfd
//! (`kernel/doorbell.rs`), CPU affinity (`kernel/cpu.rs`), a shared segment's
//! memfd (`kernel/memfd.rs`) and descriptors passed between processes
//! (`kernel/fdpass.rs`). The rooms above call these
//! and never the system calls themselves.

pub(crate) mod cpu;
pub(crate) mod doorbell;
pub(crate) mod fdpass;
pub(crate) mod mem;
pub(crate) mod memfd;
pub(crate) mod uffd;
