//! What the kernel says about the file under a `file` store: its kind and
//! size, the alignment `O_DIRECT` wants, and the calls that free or zero a
//! range. Every ioctl and `fallocate` of the backend lives here.

use crate::PAGE_SIZE;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;

// Block-layer ioctls from <linux/fs.h> that the libc crate lacks. The numbers
// use the generic _IO/_IOR encoding (x86_64, aarch64, riscv64).
/// `_IOR(0x12, 114, size_t)`: device size in bytes.
const BLKGETSIZE64: libc::Ioctl = 0x8008_1272;
/// `_IO(0x12, 127)`: zero a byte range, taking `[start, len]` as two u64s.
const BLKZEROOUT: libc::Ioctl = 0x127f;
/// How many `EINTR`s a single call tolerates.
const INTERRUPTS_MAX: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Regular,
    Block,
}

impl Kind {
    pub(super) fn of(file: &File) -> io::Result<Kind> {
        let kind = file.metadata()?.file_type();
        if kind.is_file() {
            Ok(Kind::Regular)
        } else if kind.is_block_device() {
            Ok(Kind::Block)
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "neither a regular file nor a block device",
            ))
        }
    }
}

/// Bytes the file or device holds.
pub(super) fn capacity_bytes(file: &File, kind: Kind) -> io::Result<u64> {
    if kind == Kind::Regular {
        return Ok(file.metadata()?.len());
    }
    let mut len_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // at a live local of that type.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut len_bytes as *mut u64) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(len_bytes)
}

/// The alignment `O_DIRECT` requires of (memory address, file offset), or
/// `None` where the kernel reports that the file cannot do direct I/O.
///
/// `statx(STATX_DIOALIGN)` answers exactly on Linux 6.1+ for filesystems
/// that implement it. Elsewhere a block device's logical sector size is the
/// rule; a file falls back to `PAGE_SIZE`, which satisfies every filesystem
/// with blocks up to 4 KiB.
pub(super) fn direct_alignment(file: &File, kind: Kind) -> io::Result<Option<(usize, usize)>> {
    if let Some(reported) = statx_dio_alignment(file)? {
        return Ok(reported);
    }
    if kind == Kind::Regular {
        return Ok(Some((PAGE_SIZE, PAGE_SIZE)));
    }
    let mut sector_bytes: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points at a
    // live local of that type.
    let rc = unsafe {
        libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET, &mut sector_bytes as *mut libc::c_int)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let sector_bytes = usize::try_from(sector_bytes).unwrap_or(PAGE_SIZE);
    Ok(Some((sector_bytes, sector_bytes)))
}

/// `Some(answer)` when the kernel reports direct-I/O alignment, `None` when
/// this kernel or filesystem does not say.
fn statx_dio_alignment(file: &File) -> io::Result<Option<Option<(usize, usize)>>> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an empty C string with AT_EMPTY_PATH describes the fd itself;
    // the kernel writes one `struct statx` into the live local.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 {
        let err = io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::ENOSYS) { Ok(None) } else { Err(err) };
    }
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return Ok(None);
    }
    // Zeroes in a reported answer mean "no direct I/O on this file".
    let (mem, offset) = (stx.stx_dio_mem_align as usize, stx.stx_dio_offset_align as usize);
    Ok(Some((mem > 0 && offset > 0).then_some((mem, offset))))
}

/// Deallocate `offset..offset + len` and make it read as zeroes, keeping the
/// size. Works on most local filesystems and, since Linux 4.9, on block
/// devices (where it becomes a write-zeroes request that may unmap).
pub(super) fn punch_hole(file: &File, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let (offset, len) = (as_off(offset_bytes)?, as_off(len_bytes)?);
    // SAFETY: fallocate touches only the file behind our fd; no memory of
    // this process is passed.
    retry_interrupted(|| unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) })
}

/// Zero `offset..offset + len` of a block device (BLKZEROOUT): the device's
/// write-zeroes command where it has one, else the kernel writes zeroes.
pub(super) fn zero_out(file: &File, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset_bytes, len_bytes];
    // SAFETY: BLKZEROOUT reads two u64s through the pointer, which points at
    // a live local array of exactly that.
    retry_interrupted(|| unsafe { libc::ioctl(file.as_raw_fd(), BLKZEROOUT, range.as_ptr()) })
}

/// Make completed writes durable (data and the metadata needed to read it).
pub(super) fn data_sync(file: &File) -> io::Result<()> {
    // SAFETY: fdatasync takes only our fd.
    retry_interrupted(|| unsafe { libc::fdatasync(file.as_raw_fd()) })
}

/// Whether an error from `punch_hole` or `zero_out` means "this file or
/// device cannot do that", so the caller should try the next way.
pub(super) fn is_unsupported(err: &io::Error) -> bool {
    let codes = [libc::EOPNOTSUPP, libc::ENOTTY, libc::ENOSYS, libc::EINVAL];
    err.raw_os_error().is_some_and(|code| codes.contains(&code))
}

fn as_off(bytes: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))
}

/// Run a syscall that returns 0 or -1/errno, again after each `EINTR`.
fn retry_interrupted(mut call: impl FnMut() -> libc::c_int) -> io::Result<()> {
    for _ in 0..INTERRUPTS_MAX {
        if call() == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted too many times"))
}
