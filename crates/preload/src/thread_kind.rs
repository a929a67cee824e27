//! Is the calling thread one of ours (named `memlend-*`: the fault handler
//! and its helpers)? Such a thread must never enter the program's own
//! allocator: the program may hold that allocator's lock while it madvises
//! far memory, and madvise waits for the handler to read the REMOVE event.
//! (Seen with redis-server: jemalloc purges under its lock; the handler's
//! first thread-local destructor registration calls calloc.) Our threads
//! allocate from glibc directly instead.

use std::cell::Cell;

const UNKNOWN: u8 = 0;
const OURS: u8 = 1;
const THEIRS: u8 = 2;

thread_local! {
    static KIND: Cell<u8> = const { Cell::new(UNKNOWN) };
}

/// Threads we start are named before they run any code (std sets the name
/// first), so the first look is the right one; it is cached per thread.
pub fn ours() -> bool {
    KIND.with(|k| match k.get() {
        OURS => true,
        THEIRS => false,
        _ => {
            let ours = name_is_ours();
            k.set(if ours { OURS } else { THEIRS });
            ours
        }
    })
}

fn name_is_ours() -> bool {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into `name`.
    let rc = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    rc == 0 && name.starts_with(b"memlend-")
}

/// Run `f` as one of ours: what it allocates, including what glibc
/// allocates for a thread it starts (its TLS), comes from glibc. For the
/// fork handlers: the program's allocator may be locked for the fork then
/// (jemalloc's handlers run around ours), and a thread started there that
/// later exits would free glibc's way what that allocator gave.
pub fn while_ours<T>(f: impl FnOnce() -> T) -> T {
    let was = KIND.with(|k| k.replace(OURS));
    let out = f();
    KIND.with(|k| k.set(was));
    out
}
