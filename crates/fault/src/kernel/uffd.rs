//! The userfaultfd edge: the file descriptor, its ioctls and its messages.
//!
//! libc has no userfaultfd definitions, so the structs and request numbers of
//! `<linux/userfaultfd.h>` are spelled out here. Every call takes a range the
//! caller has checked lies inside a mapping registered with this descriptor;
//! the kernel checks it again and answers EINVAL/ENOENT otherwise, so a wrong
//! range is an error, never memory unsafety.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const UFFD_API: u64 = 0xAA;
/// `_IOWR(0xAA, nr, size)`, `_IOR(0xAA, nr, size)`, `_IO(0xAA, nr)`.
const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}
const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}
const USERFAULTFD_IOC_NEW: u64 = 0xAA << 8;
const UFFDIO_API: u64 = iowr(0x3F, size_of::<ApiArgs>());
const UFFDIO_REGISTER: u64 = iowr(0x00, size_of::<RegisterArgs>());
const UFFDIO_UNREGISTER: u64 = ior(0x01, size_of::<Range>());
const UFFDIO_WAKE: u64 = ior(0x02, size_of::<Range>());
const UFFDIO_COPY: u64 = iowr(0x03, size_of::<CopyArgs>());
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, size_of::<RangeArgs>());
const UFFDIO_MOVE: u64 = iowr(0x05, size_of::<CopyArgs>());
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, size_of::<WriteProtectArgs>());
const UFFDIO_POISON: u64 = iowr(0x08, size_of::<RangeArgs>());

const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const FEATURE_EVENT_FORK: u64 = 1 << 1;
const FEATURE_EVENT_REMAP: u64 = 1 << 2;
const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const FEATURE_MISSING_SHMEM: u64 = 1 << 5;
const FEATURE_THREAD_ID: u64 = 1 << 8;
const FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
const FEATURE_POISON: u64 = 1 << 14;
const FEATURE_MOVE: u64 = 1 << 16;
const REGISTER_MODE_MISSING: u64 = 1 << 0;
const REGISTER_MODE_WP: u64 = 1 << 1;
const COPY_MODE_DONTWAKE: u64 = 1 << 0;
const COPY_MODE_WP: u64 = 1 << 1;
const WP_MODE_WP: u64 = 1 << 0;
const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;
const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

#[repr(C)]
struct ApiArgs {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
struct RegisterArgs {
    range: Range,
    mode: u64,
    ioctls: u64,
}

/// `uffdio_copy` and `uffdio_move` share this layout.
#[repr(C)]
struct CopyArgs {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    result: i64,
}

/// `uffdio_zeropage` and `uffdio_poison` share this layout.
#[repr(C)]
struct RangeArgs {
    range: Range,
    mode: u64,
    result: i64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
struct WriteProtectArgs {
    range: Range,
    mode: u64,
}

/// `struct uffd_msg`: 32 bytes: the event, then a union of three words.
/// A page fault uses (flags, address, thread id); REMOVE and UNMAP use
/// (start, end); REMAP uses (from, to, len).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawMsg {
    event: u8,
    reserved: [u8; 7],
    arg: [u64; 3],
}
const _: () = assert!(size_of::<RawMsg>() == 32);

/// One page fault, as the handler needs it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fault {
    pub addr: usize,
    /// A write: the page is about to be dirtied, so a zero page would only
    /// be copied on write at once.
    pub write: bool,
    /// A write to a write-protected page (a clean page being dirtied), not a
    /// missing page.
    pub wp: bool,
    /// The faulting thread (0 if the kernel did not say).
    pub tid: u32,
}

/// One message from the descriptor.
#[derive(Clone, Copy, Debug)]
pub enum Msg {
    Fault(Fault),
    /// MADV_DONTNEED, MADV_REMOVE or MADV_FREE of `start..end`: read before
    /// the kernel drops anything (the caller waits until we read this).
    Remove {
        start: usize,
        end: usize,
    },
    /// munmap of `start..end`, already done.
    Unmap {
        start: usize,
        end: usize,
    },
    /// mremap moved `len` bytes from `from` to `to`.
    Remap {
        from: usize,
        to: usize,
        len: usize,
    },
    /// The process forked: `fd` is a new descriptor, now in our table and
    /// ours to close, for the child's copy of the registered mappings.
    Fork {
        fd: i32,
    },
}

impl Default for Msg {
    fn default() -> Msg {
        Msg::Fault(Fault::default())
    }
}

/// A userfaultfd, opened non-blocking with the features this crate uses.
pub struct Uffd {
    fd: OwnedFd,
}

/// The region's descriptor: MOVE for eviction, POISON for pages whose store
/// read failed, WP faults for dirty tracking, and the non-cooperative events
/// that tell us about free()/munmap/madvise/mremap of region memory; the
/// faulting thread's id, for core placement (`kernel/cpu.rs`).
const REGION_FEATURES: u64 = FEATURE_PAGEFAULT_FLAG_WP
    | FEATURE_POISON
    | FEATURE_MOVE
    | FEATURE_EVENT_REMOVE
    | FEATURE_EVENT_UNMAP
    | FEATURE_EVENT_REMAP
    | FEATURE_THREAD_ID;
/// The staging mapping's descriptor: MOVE only. It must not ask for REMOVE
/// events, since the handler itself drops staged pages with MADV_DONTNEED,
/// and it would wait for ever on an event only it can read.
const STAGING_FEATURES: u64 = FEATURE_MOVE;
/// A forked child's descriptor (`fork/child/serve.rs`): WP faults, to know the pages
/// it wrote, POISON for pages its parent cannot give, and the faulting
/// thread's id, to serve it from its core. No events: the
/// child's own madvise and munmap must not wait on its handler, which
/// drops pages with MADV_DONTNEED itself.
const CHILD_FEATURES: u64 = FEATURE_PAGEFAULT_FLAG_WP | FEATURE_POISON | FEATURE_THREAD_ID;
/// A shared segment's descriptor (`shmem/`): MISSING and WP faults on
/// shmem, POISON for pages the store cannot give, and FORK events, so that
/// a child's copy of the segment is registered by the kernel in the fork
/// itself (with no moment in which an evicted page reads as zeroes) and its
/// descriptor comes to whoever reads this one.
const SHARED_FEATURES: u64 = FEATURE_PAGEFAULT_FLAG_WP
    | FEATURE_EVENT_FORK
    | FEATURE_MISSING_SHMEM
    | FEATURE_WP_HUGETLBFS_SHMEM
    | FEATURE_POISON
    | FEATURE_THREAD_ID;

impl Uffd {
    /// The descriptor a region is registered with.
    pub fn open_region() -> io::Result<Uffd> {
        Uffd::open(REGION_FEATURES)
    }

    /// The descriptor the staging mapping is registered with.
    pub fn open_staging() -> io::Result<Uffd> {
        Uffd::open(STAGING_FEATURES)
    }

    /// The descriptor a forked child registers the region with.
    pub fn open_child() -> io::Result<Uffd> {
        Uffd::open(CHILD_FEATURES)
    }

    /// The descriptor a shared segment is registered with, and whether it
    /// has fork events. The kernel gives those only to a process that may
    /// ptrace (root, CAP_SYS_PTRACE); any other gets a descriptor without
    /// them, and each child it forks registers itself (`shmem/adopt.rs`).
    pub fn open_shared() -> io::Result<(Uffd, bool)> {
        match Uffd::open(SHARED_FEATURES) {
            Ok(uffd) => Ok((uffd, true)),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                Ok((Uffd::open(SHARED_FEATURES & !FEATURE_EVENT_FORK)?, false))
            }
            Err(e) => Err(e),
        }
    }

    /// A descriptor received from elsewhere (another process, a FORK
    /// event), already set up by whoever opened it.
    pub fn from_fd(fd: OwnedFd) -> Uffd {
        Uffd { fd }
    }

    /// The descriptor a FORK event carried (`Msg::Fork`).
    pub fn from_fork_event(fd: i32) -> Uffd {
        // SAFETY: the kernel installed `fd` in our table as it delivered
        // the event we read, and nothing else owns it.
        Uffd { fd: unsafe { OwnedFd::from_raw_fd(fd) } }
    }

    fn open(features: u64) -> io::Result<Uffd> {
        let fd = open_raw()?;
        let uffd = Uffd { fd };
        let mut api = ApiArgs { api: UFFD_API, features, ioctls: 0 };
        uffd.ioctl(UFFDIO_API, &mut api)?;
        Ok(uffd)
    }

    /// Stop handling `start..start + len_bytes`: its faults and events no
    /// longer come to us, and threads waiting on it are woken.
    pub fn unregister(&self, start: usize, len_bytes: usize) -> io::Result<()> {
        let mut args = range(start, len_bytes);
        self.ioctl(UFFDIO_UNREGISTER, &mut args)
    }

    /// Ask for MISSING faults on `start..start + len_bytes`, and with
    /// `write_protect` for faults on writes to write-protected pages too.
    pub fn register(&self, start: usize, len_bytes: usize, write_protect: bool) -> io::Result<()> {
        let wp = if write_protect { REGISTER_MODE_WP } else { 0 };
        let mode = REGISTER_MODE_MISSING | wp;
        let mut args = RegisterArgs { range: range(start, len_bytes), mode, ioctls: 0 };
        self.ioctl(UFFDIO_REGISTER, &mut args)
    }

    /// Map a copy of `src` (one or more whole pages) at `dst`, waking faulters.
    /// With `write_protect` the mapping is read-only to its users: their first
    /// write raises a WP fault.
    pub fn copy(&self, dst: usize, src: &[u8], write_protect: bool) -> io::Result<()> {
        let mut args = CopyArgs {
            dst: dst as u64,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode: if write_protect { COPY_MODE_WP } else { 0 },
            result: 0,
        };
        self.ioctl(UFFDIO_COPY, &mut args)
    }

    /// [`Uffd::copy`] without waking the threads waiting on the page:
    /// [`Uffd::wake`] them after.
    pub fn copy_no_wake(&self, dst: usize, src: &[u8], write_protect: bool) -> io::Result<()> {
        let mut args = CopyArgs {
            dst: dst as u64,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode: COPY_MODE_DONTWAKE | if write_protect { COPY_MODE_WP } else { 0 },
            result: 0,
        };
        self.ioctl(UFFDIO_COPY, &mut args)
    }

    /// [`Uffd::copy`] of several pages, saying how many bytes were mapped
    /// even when it fails part-way (the kernel stops at the first page it
    /// cannot map).
    pub fn copy_run(&self, dst: usize, src: &[u8], write_protect: bool) -> (usize, io::Result<()>) {
        let mut args = CopyArgs {
            dst: dst as u64,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode: if write_protect { COPY_MODE_WP } else { 0 },
            result: 0,
        };
        let result = self.ioctl(UFFDIO_COPY, &mut args);
        let copied = if result.is_ok() { src.len() } else { args.result.max(0) as usize };
        (copied, result)
    }

    /// Write-protect the pages mapped in `start..start + len_bytes`: a later
    /// write to one of them raises a WP fault. Pages not mapped are skipped.
    pub fn protect(&self, start: usize, len_bytes: usize) -> io::Result<()> {
        let mut args = WriteProtectArgs { range: range(start, len_bytes), mode: WP_MODE_WP };
        self.ioctl(UFFDIO_WRITEPROTECT, &mut args)
    }

    /// Lift write protection from `start..start + len_bytes` and wake the
    /// threads waiting on it.
    pub fn unprotect(&self, start: usize, len_bytes: usize) -> io::Result<()> {
        let mut args = WriteProtectArgs { range: range(start, len_bytes), mode: 0 };
        self.ioctl(UFFDIO_WRITEPROTECT, &mut args)
    }

    /// Map the shared zero page over `start..start + len_bytes`.
    pub fn zeropage(&self, start: usize, len_bytes: usize) -> io::Result<()> {
        let mut args = RangeArgs { range: range(start, len_bytes), mode: 0, result: 0 };
        self.ioctl(UFFDIO_ZEROPAGE, &mut args)
    }

    /// Move the pages at `src` to `dst` (whose PTEs must be empty): afterwards
    /// `src` is missing, so any access faults to us. Atomic per page, unlike
    /// copy-then-MADV_DONTNEED, which loses a write landing in between.
    /// `dst` must be registered with this descriptor; `src` need not be.
    pub fn move_pages(&self, dst: usize, src: usize, len_bytes: usize) -> io::Result<()> {
        self.move_run(dst, src, len_bytes).1
    }

    /// [`Uffd::move_pages`] of several pages, saying how many bytes moved
    /// even when it stops part-way (the kernel then answers EAGAIN with the
    /// count; an error at the first page is that page's own error).
    pub fn move_run(&self, dst: usize, src: usize, len_bytes: usize) -> (usize, io::Result<()>) {
        let mut args = CopyArgs {
            dst: dst as u64,
            src: src as u64,
            len: len_bytes as u64,
            mode: 0,
            result: 0,
        };
        let result = self.ioctl(UFFDIO_MOVE, &mut args);
        let moved = if result.is_ok() { len_bytes } else { args.result.max(0) as usize };
        (moved, result)
    }

    /// Wake threads waiting on `start..start + len_bytes` (a fault someone
    /// else already resolved).
    pub fn wake(&self, start: usize, len_bytes: usize) -> io::Result<()> {
        let mut args = range(start, len_bytes);
        self.ioctl(UFFDIO_WAKE, &mut args)
    }

    /// Mark the range poisoned: accessing it raises SIGBUS in the accessor.
    pub fn poison(&self, start: usize, len_bytes: usize) -> io::Result<()> {
        let mut args = RangeArgs { range: range(start, len_bytes), mode: 0, result: 0 };
        self.ioctl(UFFDIO_POISON, &mut args)
    }

    /// [`Uffd::poison`] of several pages, saying how many bytes were
    /// poisoned even when it stops part-way (EEXIST at a mapped page).
    pub fn poison_run(&self, start: usize, len_bytes: usize) -> (usize, io::Result<()>) {
        let mut args = RangeArgs { range: range(start, len_bytes), mode: 0, result: 0 };
        let result = self.ioctl(UFFDIO_POISON, &mut args);
        let done = if result.is_ok() { len_bytes } else { args.result.max(0) as usize };
        (done, result)
    }

    /// Read pending messages into `msgs`; returns how many. Zero means none
    /// pending right now (the descriptor is non-blocking).
    pub fn read_msgs(&self, msgs: &mut [Msg; 16]) -> io::Result<usize> {
        let mut raw = [RawMsg::default(); 16];
        // SAFETY: `raw` is writable for its full size in bytes, which is what
        // we pass; RawMsg is plain data, so any bytes the kernel writes are a
        // valid value.
        let n =
            unsafe { libc::read(self.fd.as_raw_fd(), raw.as_mut_ptr().cast(), size_of_val(&raw)) };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) => Ok(0),
                _ => Err(err),
            };
        }
        let got = n as usize / size_of::<RawMsg>();
        let mut count = 0;
        for msg in &raw[..got] {
            let Some(parsed) = parse(msg) else {
                tracing::warn!("userfaultfd: unexpected event {:#x} ignored", msg.event);
                continue;
            };
            msgs[count] = parsed;
            count += 1;
        }
        Ok(count)
    }

    fn ioctl<T>(&self, request: u64, args: &mut T) -> io::Result<()> {
        // SAFETY: every request number above is paired by its caller with the
        // `#[repr(C)]` struct of matching size and layout, which the kernel
        // reads and writes only within that size. Ranges it acts on are
        // checked by the kernel against this descriptor's registrations.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), request as _, args as *mut T) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl AsFd for Uffd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn parse(msg: &RawMsg) -> Option<Msg> {
    let [a, b, c] = msg.arg.map(|w| w as usize);
    Some(match msg.event {
        EVENT_PAGEFAULT => Msg::Fault(Fault {
            addr: b,
            write: msg.arg[0] & PAGEFAULT_FLAG_WRITE != 0,
            wp: msg.arg[0] & PAGEFAULT_FLAG_WP != 0,
            // `feat.ptid`, a u32 at the start of the third word.
            tid: msg.arg[2] as u32,
        }),
        // `arg.fork.ufd`, a u32 at the start of the first word.
        EVENT_FORK => Msg::Fork { fd: msg.arg[0] as u32 as i32 },
        EVENT_REMOVE => Msg::Remove { start: a, end: b },
        EVENT_UNMAP => Msg::Unmap { start: a, end: b },
        EVENT_REMAP => Msg::Remap { from: a, to: b, len: c },
        _ => return None,
    })
}

fn range(start: usize, len_bytes: usize) -> Range {
    Range { start: start as u64, len: len_bytes as u64 }
}

/// The syscall first; where it is refused to unprivileged callers,
/// `/dev/userfaultfd` (whose file mode decides instead).
fn open_raw() -> io::Result<OwnedFd> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: userfaultfd(2) takes one integer argument and returns a new fd
    // or -1; it touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd >= 0 {
        // SAFETY: the kernel just returned this fd to us and nothing else owns it.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    }
    let dev = std::fs::File::open("/dev/userfaultfd")?;
    // SAFETY: USERFAULTFD_IOC_NEW takes its flags by value and returns a new fd.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above, a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Which of the descriptors [`wait`] saw ready.
#[derive(Debug, PartialEq, Eq)]
pub enum Ready {
    Faults,
    Stop,
    /// The doorbell rang: a helper thread finished a job.
    Bell,
    /// Timed out or interrupted: look at the stop flag and wait again.
    Nothing,
}

/// Block until `uffd` has messages, `stop` is readable or hung up, `bell`
/// (if any) rang, or `timeout_ms` passes.
pub fn wait(
    uffd: &Uffd,
    stop: impl AsFd,
    bell: Option<BorrowedFd<'_>>,
    timeout_ms: i32,
) -> io::Result<Ready> {
    let fd_of = |fd: Option<BorrowedFd<'_>>| fd.map_or(-1, |fd| fd.as_raw_fd());
    let mut fds = [
        libc::pollfd { fd: stop.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: uffd.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        // A negative fd is ignored by poll.
        libc::pollfd { fd: fd_of(bell), events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: `fds` is a valid array of pollfd, and we pass its length.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, timeout_ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EINTR) => Ok(Ready::Nothing),
            _ => Err(err),
        };
    }
    Ok(match (fds[0].revents, fds[1].revents, fds[2].revents) {
        (0, 0, 0) => Ready::Nothing,
        (0, 0, _) => Ready::Bell,
        (0, _, _) => Ready::Faults,
        _ => Ready::Stop,
    })
}

/// Block until any of `fds` is readable or hung up, or `timeout_ms`
/// passes; `ready[i]` says which. Interrupted counts as nothing ready.
pub fn wait_any(fds: &[BorrowedFd<'_>], timeout_ms: i32, ready: &mut Vec<bool>) -> io::Result<()> {
    let mut polls: Vec<libc::pollfd> = (fds.iter())
        .map(|fd| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 })
        .collect();
    // SAFETY: `polls` is a valid array of pollfd, and we pass its length.
    let rc = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as _, timeout_ms) };
    ready.clear();
    if rc < 0 {
        let err = io::Error::last_os_error();
        ready.resize(fds.len(), false);
        return if err.raw_os_error() == Some(libc::EINTR) { Ok(()) } else { Err(err) };
    }
    ready.extend(polls.iter().map(|p| p.revents != 0));
    Ok(())
}

/// UFFDIO_* answers EAGAIN while the address space is changing under it;
/// a few tries cover a change that is finishing.
const EAGAIN_TRIES: usize = 16;

/// Run one UFFDIO_* call that maps the page at `page_addr`. EEXIST means it
/// is mapped already, which is all we wanted; the kernel wakes waiters only
/// on success, so wake them here.
pub(crate) fn resolve(
    uffd: &Uffd,
    page_addr: usize,
    call: impl FnMut() -> io::Result<()>,
) -> io::Result<()> {
    match retry_eagain(call) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            uffd.wake(page_addr, memlend_store::PAGE_SIZE)
        }
        other => other,
    }
}

/// Run one UFFDIO_* call, retrying EAGAIN a bounded number of times.
pub(crate) fn retry_eagain(mut call: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    let mut last = Ok(());
    for _ in 0..EAGAIN_TRIES {
        last = call();
        match &last {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => std::thread::yield_now(),
            _ => return last,
        }
    }
    last
}

#[cfg(test)]
#[path = "uffd_tests.rs"]
pub(crate) mod tests;

/// Whether this process may use userfaultfd, as far regions need; if not,
/// why, and how to allow it. Opens a descriptor and closes it again.
pub fn check_access() -> Result<(), String> {
    match Uffd::open_region() {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) => Err(format!(
            "this user may not use userfaultfd ({e}: vm.unprivileged_userfaultfd is {}, and \
             /dev/userfaultfd is not open to it). Allow it in one of three ways: give a group \
             read-write on /dev/userfaultfd (a udev rule: KERNEL==\"userfaultfd\", \
             GROUP=\"memlend\", MODE=\"0660\") and add the user to it (`usermod -aG memlend \
             USER`, then log in again); or `sysctl vm.unprivileged_userfaultfd=1`; or run as root",
            std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
                .map(|v| v.trim().to_string())
                .unwrap_or_else(|_| "unknown".into())
        )),
        Err(e) => Err(format!("userfaultfd is not available here: {e}")),
    }
}
