//! A shared segment's pages (`shmem/`): a memfd, which every process that
//! maps it shares. Its pages are read without mapping them (`pread`) and
//! dropped from every process at once (a hole punched), which is what lets
//! one server evict a page that many processes map.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub struct Memfd {
    fd: OwnedFd,
}

impl Memfd {
    /// A new memfd of `len_bytes`, all holes (zeroes).
    pub fn create(len_bytes: usize) -> io::Result<Memfd> {
        // SAFETY: memfd_create reads the NUL-terminated name and returns a
        // new fd or -1; it touches no other memory of ours.
        let fd = unsafe { libc::memfd_create(c"memlend-shared".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd and nothing else owns it.
        let memfd = Memfd { fd: unsafe { OwnedFd::from_raw_fd(fd) } };
        // SAFETY: ftruncate on our own fd; no memory of ours is touched.
        if unsafe { libc::ftruncate(fd, len_bytes as i64) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(memfd)
    }

    /// A memfd received from another process.
    pub fn from_fd(fd: OwnedFd) -> Memfd {
        Memfd { fd }
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Its size in bytes.
    pub fn len_bytes(&self) -> io::Result<u64> {
        Ok(std::fs::File::from(self.fd.try_clone()?).metadata()?.len())
    }

    /// Map all of it shared, where the kernel chooses, with `prot`.
    pub fn map(&self, len_bytes: usize, prot: i32) -> io::Result<usize> {
        // SAFETY: a new shared mapping of our own memfd at an address the
        // kernel chooses: it replaces nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len_bytes,
                prot,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(p as usize)
    }

    /// Undo [`Memfd::map`] (when the segment cannot be served after all).
    pub fn unmap(addr: usize, len_bytes: usize) {
        // SAFETY: `addr..+len_bytes` is a mapping `map` made that nobody
        // has been given yet.
        unsafe { libc::munmap(addr as *mut libc::c_void, len_bytes) };
    }

    /// Make `addr..+len_bytes` inaccessible: a segment this process can no
    /// longer be served in faults (SIGSEGV) rather than reads zeroes.
    pub fn seal_off(addr: usize, len_bytes: usize) {
        // SAFETY: changes only the protection of the segment's mapping.
        unsafe { libc::mprotect(addr as *mut libc::c_void, len_bytes, libc::PROT_NONE) };
    }

    /// Read `buf.len()` bytes at `offset` (a hole reads as zeroes and is
    /// not filled).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let file = std::mem::ManuallyDrop::new(
            // SAFETY: a borrowed view of our fd as a File, never dropped
            // (ManuallyDrop), so the fd stays ours and open.
            unsafe { std::fs::File::from_raw_fd(self.fd.as_raw_fd()) },
        );
        file.read_exact_at(buf, offset)
    }

    /// Write `buf` at `offset` (filling a hole; no mapping faults).
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        // SAFETY: as in `read_at`: a borrowed view, never dropped.
        let file =
            std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(self.fd.as_raw_fd()) });
        file.write_all_at(buf, offset)
    }

    /// Punch a hole over `offset..offset + len`: the pages leave the
    /// memfd and every process's page tables at once.
    pub fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        loop {
            // SAFETY: fallocate acts on our fd's file only.
            let rc =
                unsafe { libc::fallocate(self.fd.as_raw_fd(), mode, offset as i64, len as i64) };
            if rc == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(err);
            }
        }
    }
}
