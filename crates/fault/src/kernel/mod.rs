//! The kernel's interfaces, and the only `unsafe` code of the crate: the
//! userfaultfd and its ioctls (`kernel/uffd.rs`), mmap, madvise and munmap
//! (`kernel/mem.rs`), the eventfd the handler polls beside the userfaultfd
//! (`kernel/doorbell.rs`), and CPU affinity (`kernel/cpu.rs`). The rooms above call these
//! and never the system calls themselves.

pub(crate) mod cpu;
pub(crate) mod doorbell;
pub(crate) mod mem;
pub(crate) mod uffd;
