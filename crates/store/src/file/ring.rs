//! Several vectored calls at once through io_uring, so a batch of scattered
//! runs (an eviction batch written back, a prefetch read) keeps the disk's
//! queue full instead of waiting on each run in turn. On this VM's disk 4 KiB
//! random writes run at 24 K/s one at a time and 80 K/s eight deep (fio,
//! crates/store/DESIGN.md).
//!
//! Each thread that does batched file I/O gets its own small ring, made on
//! first use: no lock between the handler, the write-back and the fetch
//! threads, and no ring at all in threads that never batch. Where the kernel
//! refuses io_uring (disabled by sysctl, filtered by seccomp, too old) the
//! calls run one after another; the caller cannot tell but by time.
//!
//! A lone call (a fault's one-page read) goes straight to `preadv`: the
//! ring has nothing to overlap it with, and spinning on the ring for its
//! completion instead of sleeping measured 6% slower overall, at 46% more
//! CPU (crates/store/DESIGN.md, "The SSD tier").

use super::io::{transfer, Dir};
use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Once;

/// Calls in flight at once per thread. Deeper gains little on one disk (fio:
/// 80 K writes/s at depth 8) and each entry pins its buffers until it ends.
pub(super) const RING_ENTRIES: usize = 32;
/// How many times in a row `io_uring_enter` may fail with a transient error
/// (EINTR, EAGAIN, EBUSY) before the ring is declared broken.
const ENTER_RETRIES_MAX: usize = 1000;

/// One vectored call: `iovs` moved at byte `offset`.
pub(super) struct Call {
    pub offset: u64,
    pub iovs: Vec<libc::iovec>,
}

enum Slot {
    Untried,
    Ready(Box<IoUring>),
    Unavailable,
}

thread_local! {
    static RING: RefCell<Slot> = const { RefCell::new(Slot::Untried) };
}

/// Move every byte of every call: at once through this thread's ring when
/// there is more than one call and a ring, else one call after another.
///
/// # Safety
/// As for [`transfer`]: every iovec of every call names memory valid for
/// writes (`Dir::Read`) or reads (`Dir::Write`) of its length, which no other
/// code touches until this returns.
pub(super) unsafe fn transfer_all(
    fd: BorrowedFd<'_>,
    dir: Dir,
    calls: &mut [Call],
) -> io::Result<()> {
    if calls.len() > 1 {
        let ringed = RING.with(|slot| {
            let mut slot = slot.borrow_mut();
            let ring = ring_of(&mut slot)?;
            // SAFETY: the caller vouches for every iovec of `calls`.
            Some(
                calls
                    .chunks_mut(RING_ENTRIES)
                    .try_for_each(|chunk| unsafe { transfer_chunk(ring, fd, dir, chunk) }),
            )
        });
        if let Some(result) = ringed {
            return result;
        }
    }
    for call in calls {
        // SAFETY: the caller vouches for the iovecs.
        unsafe { transfer(fd, dir, call.offset, &mut call.iovs)? };
    }
    Ok(())
}

/// Read each `(offset, bufs)` of `calls`, at once where io_uring allows.
pub(super) fn read_each_at(
    fd: BorrowedFd<'_>,
    calls: &mut [(u64, Vec<&mut [u8]>)],
) -> io::Result<()> {
    let mut ring_calls: Vec<Call> = calls
        .iter_mut()
        .map(|(offset, bufs)| Call {
            offset: *offset,
            iovs: bufs
                .iter_mut()
                .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() })
                .collect(),
        })
        .collect();
    // SAFETY: every iovec was made just above from a `&mut [u8]` in `calls`,
    // which we borrow mutably for this whole call.
    unsafe { transfer_all(fd, Dir::Read, &mut ring_calls) }
}

/// Write each `(offset, bufs)` of `calls`, at once where io_uring allows.
pub(super) fn write_each_at(fd: BorrowedFd<'_>, calls: &[(u64, Vec<&[u8]>)]) -> io::Result<()> {
    let mut ring_calls: Vec<Call> = calls
        .iter()
        .map(|(offset, bufs)| Call {
            offset: *offset,
            iovs: bufs
                .iter()
                .map(|b| libc::iovec { iov_base: b.as_ptr().cast_mut().cast(), iov_len: b.len() })
                .collect(),
        })
        .collect();
    // SAFETY: every iovec was made just above from a `&[u8]` in `calls`,
    // borrowed for this whole call; writes only read through them.
    unsafe { transfer_all(fd, Dir::Write, &mut ring_calls) }
}

/// This thread's ring, made on first use; None where the kernel has none.
fn ring_of(slot: &mut Slot) -> Option<&mut IoUring> {
    if let Slot::Untried = slot {
        *slot = match IoUring::new(RING_ENTRIES as u32) {
            Ok(ring) => Slot::Ready(Box::new(ring)),
            Err(e) => {
                static SAID: Once = Once::new();
                SAID.call_once(|| {
                    tracing::info!("io_uring unavailable ({e}): file runs go one at a time")
                });
                Slot::Unavailable
            }
        };
    }
    match slot {
        Slot::Ready(ring) => Some(ring),
        _ => None,
    }
}

/// Submit up to `RING_ENTRIES` calls and reap every one of them. A call that
/// comes back short or interrupted is finished synchronously from where it
/// stopped. Returns the first error, but only once nothing is in flight.
///
/// # Safety
/// As for [`transfer_all`].
unsafe fn transfer_chunk(
    ring: &mut IoUring,
    fd: BorrowedFd<'_>,
    dir: Dir,
    calls: &mut [Call],
) -> io::Result<()> {
    assert!(calls.len() <= RING_ENTRIES && ring.submission().is_empty());
    for (i, call) in calls.iter().enumerate() {
        let (iovs, count) = (call.iovs.as_ptr(), call.iovs.len() as u32);
        let target = types::Fd(fd.as_raw_fd());
        let entry = match dir {
            Dir::Read => opcode::Readv::new(target, iovs, count).offset(call.offset).build(),
            Dir::Write => opcode::Writev::new(target, iovs, count).offset(call.offset).build(),
        };
        // SAFETY: the entry names iovecs in `calls`, which outlive this
        // function, and this function does not return while the kernel may
        // still use them (every pushed entry is reaped below).
        unsafe { ring.submission().push(&entry.user_data(i as u64)) }
            .expect("the ring was empty and has RING_ENTRIES slots");
    }
    let mut in_flight = calls.len();
    let mut first_error = None;
    let mut retries = 0;
    while in_flight > 0 {
        if let Err(e) = ring.submit_and_wait(1) {
            retries += 1;
            if is_transient(&e) && retries < ENTER_RETRIES_MAX {
                continue;
            }
            broken_ring(e);
        }
        retries = 0;
        let done: Vec<(usize, i32)> =
            ring.completion().map(|c| (c.user_data() as usize, c.result())).collect();
        for (i, result) in done {
            in_flight -= 1;
            // SAFETY: the caller vouches for the call's iovecs.
            let finished = unsafe { finish(fd, dir, &mut calls[i], result) };
            if let Err(e) = finished {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Settle one completion: done, short (resume synchronously after what
/// moved), interrupted (redo synchronously) or failed.
///
/// # Safety
/// As for [`transfer`].
unsafe fn finish(fd: BorrowedFd<'_>, dir: Dir, call: &mut Call, result: i32) -> io::Result<()> {
    let total_bytes: usize = call.iovs.iter().map(|v| v.iov_len).sum();
    match result {
        n if n >= 0 && n as usize == total_bytes => Ok(()),
        n if n >= 0 => {
            let moved = n as usize;
            let first = super::io::advance(&mut call.iovs, 0, moved);
            let offset = call.offset + moved as u64;
            // SAFETY: the caller vouches for the iovecs; `advance` only
            // trimmed what had moved.
            unsafe { transfer(fd, dir, offset, &mut call.iovs[first..]) }
        }
        n if n == -libc::EINTR || n == -libc::EAGAIN => {
            // SAFETY: as above; nothing moved.
            unsafe { transfer(fd, dir, call.offset, &mut call.iovs) }
        }
        n => Err(io::Error::from_raw_os_error(-n)),
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY))
}

/// The kernel will not let us wait for I/O that is still writing into (or
/// reading from) the caller's buffers. Returning would hand those buffers
/// back while the disk may still write them, so the process stops here.
fn broken_ring(e: io::Error) -> ! {
    eprintln!("memlend: io_uring cannot wait for its own I/O ({e}); stopping before memory it still owns is reused");
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn iovec_of(buf: &mut [u8]) -> libc::iovec {
        libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() }
    }

    /// More calls than the ring holds, scattered and of mixed sizes, go
    /// down and come back byte for byte.
    #[test]
    fn many_scattered_calls_round_trip() {
        let file = tempfile::tempfile().unwrap();
        let calls_n = RING_ENTRIES * 2 + 3;
        let mut written: Vec<Vec<u8>> =
            (0..calls_n).map(|i| vec![i as u8 + 1; 512 * (1 + i % 3)]).collect();
        let offset = |i: usize| (i as u64 * 7 % calls_n as u64) * 4096;
        let mut calls: Vec<Call> = written
            .iter_mut()
            .enumerate()
            .map(|(i, b)| Call { offset: offset(i), iovs: vec![iovec_of(b)] })
            .collect();
        // SAFETY: every iovec points into `written`, alive and untouched
        // until the call returns.
        unsafe { transfer_all(file.as_fd(), Dir::Write, &mut calls) }.unwrap();
        let mut back: Vec<Vec<u8>> = written.iter().map(|b| vec![0; b.len()]).collect();
        let mut calls: Vec<Call> = back
            .iter_mut()
            .enumerate()
            .map(|(i, b)| Call { offset: offset(i), iovs: vec![iovec_of(b)] })
            .collect();
        // SAFETY: as above, into `back`.
        unsafe { transfer_all(file.as_fd(), Dir::Read, &mut calls) }.unwrap();
        assert_eq!(back, written);
    }

    /// Where the kernel has no io_uring, the same batch runs call by call.
    #[test]
    fn without_a_ring_calls_run_one_by_one() {
        RING.with(|slot| *slot.borrow_mut() = Slot::Unavailable);
        let file = tempfile::tempfile().unwrap();
        let (mut a, mut b) = (vec![3u8; 4096], vec![4u8; 4096]);
        let mut calls = vec![
            Call { offset: 8192, iovs: vec![iovec_of(&mut a)] },
            Call { offset: 0, iovs: vec![iovec_of(&mut b)] },
        ];
        // SAFETY: the iovecs point into `a` and `b`, alive until return.
        unsafe { transfer_all(file.as_fd(), Dir::Write, &mut calls) }.unwrap();
        let mut back = vec![0u8; 3 * 4096];
        let mut calls = vec![Call { offset: 0, iovs: vec![iovec_of(&mut back)] }];
        // SAFETY: as above, into `back`.
        unsafe { transfer_all(file.as_fd(), Dir::Read, &mut calls) }.unwrap();
        assert_eq!(back, [vec![4u8; 4096], vec![0u8; 4096], vec![3u8; 4096]].concat());
        RING.with(|slot| assert!(matches!(*slot.borrow(), Slot::Unavailable)));
    }

    /// A read past the end of the file fails, and the other calls of the
    /// batch still complete before the error comes back.
    #[test]
    fn a_failing_call_is_reported_after_the_rest_complete() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(8192).unwrap();
        let (mut a, mut b) = (vec![1u8; 4096], vec![1u8; 4096]);
        let mut calls = vec![
            Call { offset: 0, iovs: vec![iovec_of(&mut a)] },
            Call { offset: 1 << 20, iovs: vec![iovec_of(&mut b)] },
        ];
        // SAFETY: the iovecs point into `a` and `b`, alive until return.
        let err = unsafe { transfer_all(file.as_fd(), Dir::Read, &mut calls) }.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(a.iter().all(|&x| x == 0), "the good call read the file's zeroes");
    }
}
