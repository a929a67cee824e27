//! Positional vectored I/O that moves every byte asked for, and the aligned
//! buffers that `O_DIRECT` needs.
//!
//! `preadv`/`pwritev` may move fewer bytes than asked (a signal, a filesystem
//! that splits the request) and may fail with `EINTR`; callers here get either
//! the whole transfer or an error.

use crate::PAGE_SIZE;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The kernel's limit on iovecs per call (`UIO_MAXIOV`).
pub(super) const IOVECS_MAX: usize = libc::UIO_MAXIOV as usize;
/// How many `EINTR`s one transfer tolerates before giving up; a signal storm
/// that long means something else is wrong.
const INTERRUPTS_MAX: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dir {
    Read,
    Write,
}

/// Read exactly `bufs` (one after another) from byte `offset` of `fd`.
pub(super) fn read_exact_at(
    fd: BorrowedFd<'_>,
    offset: u64,
    bufs: &mut [&mut [u8]],
) -> io::Result<()> {
    let mut iovs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() })
        .collect();
    // SAFETY: every iovec was made just above from a `&mut [u8]` in `bufs`,
    // which we borrow mutably for this whole call, so each names writable
    // memory of its length that nothing else touches meanwhile.
    unsafe { transfer(fd, Dir::Read, offset, &mut iovs) }
}

/// Write all of `bufs` (one after another) at byte `offset` of `fd`.
pub(super) fn write_all_at(fd: BorrowedFd<'_>, offset: u64, bufs: &[&[u8]]) -> io::Result<()> {
    let mut iovs: Vec<libc::iovec> = bufs
        .iter()
        .map(|b| libc::iovec { iov_base: b.as_ptr().cast_mut().cast(), iov_len: b.len() })
        .collect();
    // SAFETY: every iovec was made just above from a `&[u8]` in `bufs`, which
    // we borrow for this whole call; `pwritev` only reads through them.
    unsafe { transfer(fd, Dir::Write, offset, &mut iovs) }
}

/// Move every byte `iovs` describes, resuming after short counts and `EINTR`.
///
/// # Safety
/// For `Dir::Read` each iovec must name memory valid for writes of `iov_len`
/// bytes, for `Dir::Write` valid for reads, and no other code may access that
/// memory until this returns.
pub(super) unsafe fn transfer(
    fd: BorrowedFd<'_>,
    dir: Dir,
    offset: u64,
    iovs: &mut [libc::iovec],
) -> io::Result<()> {
    assert!(iovs.len() <= IOVECS_MAX, "{} iovecs in one call", iovs.len());
    let total_bytes: usize = iovs.iter().map(|v| v.iov_len).sum();
    let mut done_bytes = 0;
    let mut first = 0;
    let mut interrupts = 0;
    // Each pass moves at least one byte or counts an interrupt: bounded.
    for _ in 0..=total_bytes + INTERRUPTS_MAX {
        if done_bytes == total_bytes {
            return Ok(());
        }
        let at = i64::try_from(offset + done_bytes as u64).expect("offset checked at open");
        let rest = &iovs[first..];
        // SAFETY: the caller vouches for the memory of every iovec; `rest` is
        // a live slice of them, and its length fits a c_int (asserted above).
        let moved = unsafe {
            match dir {
                Dir::Read => libc::preadv(fd.as_raw_fd(), rest.as_ptr(), rest.len() as i32, at),
                Dir::Write => libc::pwritev(fd.as_raw_fd(), rest.as_ptr(), rest.len() as i32, at),
            }
        };
        match moved {
            n if n > 0 => {
                done_bytes += n as usize;
                first = advance(iovs, first, n as usize);
            }
            0 => return Err(stalled(dir, offset + done_bytes as u64)),
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted || interrupts == INTERRUPTS_MAX {
                    return Err(err);
                }
                interrupts += 1;
            }
        }
    }
    unreachable!("transfer made no progress within its bound");
}

/// Consume `moved_bytes` from `iovs[first..]`; returns the new first iovec.
pub(super) fn advance(iovs: &mut [libc::iovec], mut first: usize, mut moved_bytes: usize) -> usize {
    while moved_bytes > 0 {
        let iov = &mut iovs[first];
        if moved_bytes < iov.iov_len {
            iov.iov_base = iov.iov_base.cast::<u8>().wrapping_add(moved_bytes).cast();
            iov.iov_len -= moved_bytes;
            return first;
        }
        moved_bytes -= iov.iov_len;
        first += 1;
    }
    first
}

/// A transfer of zero bytes: the file ended (it shrank behind our back) or
/// the device takes no more.
fn stalled(dir: Dir, at_bytes: u64) -> io::Error {
    match dir {
        Dir::Read => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("end of file at byte {at_bytes}: was it truncated behind the store?"),
        ),
        Dir::Write => {
            io::Error::new(io::ErrorKind::WriteZero, format!("wrote nothing at byte {at_bytes}"))
        }
    }
}

/// One page whose alignment satisfies every `O_DIRECT` memory alignment this
/// backend accepts (at most `PAGE_SIZE`).
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct AlignedPage([u8; PAGE_SIZE]);

/// A zeroed, page-aligned buffer of whole pages.
pub(super) struct AlignedBuf {
    pages: Vec<AlignedPage>,
}

impl AlignedBuf {
    pub(super) fn zeroed(len_bytes: usize) -> Self {
        assert!(len_bytes.is_multiple_of(PAGE_SIZE), "aligned buffer of {len_bytes} bytes");
        AlignedBuf { pages: vec![AlignedPage([0; PAGE_SIZE]); len_bytes / PAGE_SIZE] }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: `AlignedPage` is `repr(C)` around a byte array, so the
        // vector's storage is `len * PAGE_SIZE` initialised bytes, borrowed
        // shared for as long as `self` is.
        unsafe {
            std::slice::from_raw_parts(self.pages.as_ptr().cast(), self.pages.len() * PAGE_SIZE)
        }
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed exclusively for as long as `self` is.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.pages.as_mut_ptr().cast(),
                self.pages.len() * PAGE_SIZE,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn iov(len: usize) -> libc::iovec {
        libc::iovec { iov_base: std::ptr::null_mut(), iov_len: len }
    }

    #[test]
    fn advance_skips_whole_iovecs_and_trims_a_partial_one() {
        let mut iovs = [iov(10), iov(20), iov(30)];
        assert_eq!(advance(&mut iovs, 0, 10), 1);
        assert_eq!(advance(&mut iovs, 1, 25), 2);
        assert_eq!(iovs[2].iov_len, 25);
        assert_eq!(iovs[2].iov_base as usize, 5);
        assert_eq!(advance(&mut iovs, 2, 25), 3);
    }

    #[test]
    fn vectored_round_trip_and_eof_is_an_error() {
        let file = tempfile::tempfile().unwrap();
        let (a, b) = (vec![1u8; 100], vec![2u8; 50]);
        write_all_at(file.as_fd(), 10, &[&a, &b]).unwrap();
        let (mut x, mut y) = (vec![0u8; 60], vec![0u8; 90]);
        read_exact_at(file.as_fd(), 10, &mut [&mut x, &mut y]).unwrap();
        assert_eq!([x, y].concat(), [a, b].concat());
        let err = read_exact_at(file.as_fd(), 100, &mut [&mut [0u8; 100]]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn aligned_buf_is_page_aligned_and_zero() {
        let mut buf = AlignedBuf::zeroed(3 * PAGE_SIZE);
        assert_eq!(buf.bytes().as_ptr() as usize % PAGE_SIZE, 0);
        assert!(buf.bytes().iter().all(|&b| b == 0));
        buf.bytes_mut()[PAGE_SIZE] = 7;
        assert_eq!(buf.bytes().len(), 3 * PAGE_SIZE);
    }
}
