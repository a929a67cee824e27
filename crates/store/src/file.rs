//! `file`: pages in a regular file or on a block device (an SSD tier).
//!
//! Page `p` lives at byte `p * 4096`. Reads and writes are positional
//! (`preadv`/`pwritev`), so threads share one descriptor without a lock on a
//! file offset; runs of a batch that are adjacent on disk go down as one
//! vectored call, and the runs of one batch go down together through
//! io_uring (`ring.rs`), so scattered pages keep the disk's queue full. A
//! file is created sparse (`ftruncate`) and `discard` punches
//! holes, so the file holds only pages in use.
//!
//! Each page is still guarded by a stripe lock, because the page-atomicity
//! promise of [`PageStore`] does not come free: a buffered `pread` on ext4 or
//! tmpfs can return half of a 4 KiB `pwrite` that is in flight (measured on
//! these machines: a few torn reads per second under a tight write loop).
//!
//! With [`FileOptions::direct`] the page cache is bypassed (`O_DIRECT`). The
//! kernel then wants every buffer aligned (typically to 512 bytes); callers'
//! buffers that are not go through an aligned bounce buffer.
//!
//! Tiering (later, as a layer, not here): TeRM-style, the store for a tier
//! would open the same file twice, buffered for hot pages that benefit from
//! the page cache and `O_DIRECT` for cold pages that would only pollute it,
//! and pick a descriptor per request from the page's recent heat. Both
//! descriptors are ordinary `FileStore`s over one file, so nothing here needs
//! to change; the tier layer must only hold one stripe discipline above both.

mod device;
mod io;
mod ring;

use crate::page_locks::{LockSet, PageLocks};
use crate::{check_range, check_run, Caps, PageStore, ReadOp, StoreError, StoreInfo, StoreResult};
use crate::{WriteOp, PAGE_SHIFT, PAGE_SIZE};
use device::Kind;
use io::{AlignedBuf, IOVECS_MAX};
use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};

/// The most bytes one vectored call moves. It bounds the stripes held per
/// call and the bounce buffer an unaligned `O_DIRECT` request needs.
const IO_BYTES_MAX: usize = 1 << 20;
/// Vectored calls in flight at once (one io_uring submission): it bounds
/// the stripes held and the bounce buffer of one batch, as `IO_BYTES_MAX`
/// bounds them per call.
const GROUPS_PER_BATCH_MAX: usize = ring::RING_ENTRIES;
/// Size of the zero buffer that the write-zeroes fallback of `discard` repeats.
const ZERO_CHUNK_BYTES: usize = 64 << 10;

/// Ways to discard, tried in this order; the first that a file does not
/// support is never tried again (`discard_method` only grows).
const DISCARD_PUNCH: u8 = 0;
const DISCARD_ZERO_OUT: u8 = 1;
const DISCARD_WRITE_ZEROES: u8 = 2;

/// How the file is opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileOptions {
    /// Bypass the page cache (`O_DIRECT`). Opening fails with
    /// `StoreError::Unavailable` where the filesystem cannot do it.
    pub direct: bool,
}

/// A page store over a regular file or block device. Bad requests are
/// refused before any I/O; an I/O error part-way through a batch may leave
/// the runs before it written (as with any disk), and is returned.
pub struct FileStore {
    file: File,
    pages: u64,
    kind: Kind,
    direct: bool,
    /// Buffers whose address is not a multiple of this go through a bounce
    /// buffer; 1 when buffered.
    mem_align_bytes: usize,
    discard_frees: bool,
    discard_method: AtomicU8,
    stripes: PageLocks,
}

impl FileStore {
    /// Create (or truncate) the regular file at `path` as a sparse store of
    /// `pages` zero pages.
    pub fn create(path: &Path, pages: u64, opts: FileOptions) -> StoreResult<Self> {
        let len_bytes = pages
            .checked_mul(PAGE_SIZE as u64)
            .filter(|&l| l > 0 && i64::try_from(l).is_ok())
            .ok_or_else(|| StoreError::NoSpace(format!("a file cannot hold {pages} pages")))?;
        let file = open_options(opts, 0)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| open_error(path, opts, e))?;
        if Kind::of(&file)? != Kind::Regular {
            return Err(unavailable(path, "is not a regular file (open a device with `open`)"));
        }
        file.set_len(len_bytes)?;
        Self::from_file(file, path, Kind::Regular, pages, opts)
    }

    /// Open an existing regular file or block device. The store covers the
    /// first `len_bytes` (all of it when `None`), which must be a non-zero
    /// whole number of pages that the file or device holds. Existing contents
    /// are kept: pages read as whatever the file holds. A block device is
    /// opened exclusively (`O_EXCL`), so a mounted one is refused.
    pub fn open(path: &Path, len_bytes: Option<u64>, opts: FileOptions) -> StoreResult<Self> {
        let is_device = std::fs::metadata(path)
            .map_err(|e| open_error(path, opts, e))?
            .file_type()
            .is_block_device();
        let exclusive = if is_device { libc::O_EXCL } else { 0 };
        let file =
            open_options(opts, exclusive).open(path).map_err(|e| open_error(path, opts, e))?;
        let kind = Kind::of(&file).map_err(|e| unavailable(path, &e.to_string()))?;
        let capacity_bytes = device::capacity_bytes(&file, kind)?;
        let pages = pages_of(path, len_bytes.unwrap_or(capacity_bytes), capacity_bytes)?;
        Self::from_file(file, path, kind, pages, opts)
    }

    fn from_file(
        file: File,
        path: &Path,
        kind: Kind,
        pages: u64,
        opts: FileOptions,
    ) -> StoreResult<Self> {
        let mem_align_bytes = if opts.direct { check_direct(&file, path, kind)? } else { 1 };
        let discard_frees = kind == Kind::Regular && punch_works(&file)?;
        let first_method = match kind {
            Kind::Regular if !discard_frees => DISCARD_WRITE_ZEROES,
            _ => DISCARD_PUNCH,
        };
        let direct = opts.direct;
        tracing::debug!(
            path = %path.display(), ?kind, pages, direct, mem_align_bytes, discard_frees,
            "file store"
        );
        Ok(FileStore {
            file,
            pages,
            kind,
            direct: opts.direct,
            mem_align_bytes,
            discard_frees,
            discard_method: AtomicU8::new(first_method),
            stripes: PageLocks::new(),
        })
    }

    fn is_aligned(&self, buf: &[u8]) -> bool {
        (buf.as_ptr() as usize).is_multiple_of(self.mem_align_bytes)
    }

    /// Bytes of `bufs` whose address `O_DIRECT` would refuse.
    fn unaligned_bytes<'b>(&self, bufs: impl Iterator<Item = &'b [u8]>) -> usize {
        bufs.filter(|b| !self.is_aligned(b)).map(|b| b.len()).sum()
    }

    /// Read every group (segments adjacent on disk, one vectored call each),
    /// all at once, under the stripes of every page they cover.
    fn read_groups(&self, groups: &mut [&mut [(u64, &mut [u8])]]) -> StoreResult<()> {
        let segs = || groups.iter().flat_map(|g| g.iter());
        let mut bounce = AlignedBuf::zeroed(self.unaligned_bytes(segs().map(|(_, b)| &**b)));
        let mut locks = LockSet::new();
        for group in groups.iter() {
            let (page, run_pages) = run_of(group);
            locks.add_run(page, run_pages);
        }
        {
            let mut spare = bounce.bytes_mut();
            let mut calls: Vec<(u64, Vec<&mut [u8]>)> = Vec::with_capacity(groups.len());
            for group in groups.iter_mut() {
                let offset_bytes = group[0].0 << PAGE_SHIFT;
                let mut bufs: Vec<&mut [u8]> = Vec::with_capacity(group.len());
                for (_, buf) in group.iter_mut() {
                    if self.is_aligned(buf) {
                        bufs.push(buf);
                    } else {
                        let (piece, rest) = std::mem::take(&mut spare).split_at_mut(buf.len());
                        spare = rest;
                        bufs.push(piece);
                    }
                }
                calls.push((offset_bytes, bufs));
            }
            let _shared = self.stripes.read(&locks);
            ring::read_each_at(self.file.as_fd(), &mut calls)?;
        }
        let mut filled = bounce.bytes();
        for (_, buf) in groups.iter_mut().flat_map(|g| g.iter_mut()) {
            if !self.is_aligned(buf) {
                let (piece, rest) = filled.split_at(buf.len());
                buf.copy_from_slice(piece);
                filled = rest;
            }
        }
        Ok(())
    }

    /// Write every group (segments adjacent on disk, one vectored call
    /// each), all at once, owning the stripes of every page they cover.
    fn write_groups(&self, groups: &[&[(u64, &[u8])]]) -> StoreResult<()> {
        let segs = || groups.iter().flat_map(|g| g.iter());
        let mut bounce = AlignedBuf::zeroed(self.unaligned_bytes(segs().map(|(_, d)| *d)));
        let mut spare = bounce.bytes_mut();
        for (_, data) in segs().filter(|(_, d)| !self.is_aligned(d)) {
            let (piece, rest) = std::mem::take(&mut spare).split_at_mut(data.len());
            piece.copy_from_slice(data);
            spare = rest;
        }
        let mut staged = bounce.bytes();
        let mut locks = LockSet::new();
        let mut calls: Vec<(u64, Vec<&[u8]>)> = Vec::with_capacity(groups.len());
        for group in groups {
            let (page, run_pages) = run_of(group);
            locks.add_run(page, run_pages);
            let mut bufs: Vec<&[u8]> = Vec::with_capacity(group.len());
            for &(_, data) in group.iter() {
                if self.is_aligned(data) {
                    bufs.push(data);
                } else {
                    let (piece, rest) = staged.split_at(data.len());
                    staged = rest;
                    bufs.push(piece);
                }
            }
            calls.push((page << PAGE_SHIFT, bufs));
        }
        let _owned = self.stripes.write(&locks);
        ring::write_each_at(self.file.as_fd(), &calls)?;
        Ok(())
    }

    /// Discard by the first way this file supports, remembering what failed.
    /// The caller holds the stripes of the range.
    fn discard_locked(&self, offset_bytes: u64, len_bytes: u64) -> StoreResult<()> {
        let first = self.discard_method.load(Ordering::Relaxed);
        for method in first..DISCARD_WRITE_ZEROES {
            let result = match method {
                DISCARD_PUNCH => device::punch_hole(&self.file, offset_bytes, len_bytes),
                DISCARD_ZERO_OUT if self.kind == Kind::Block => {
                    device::zero_out(&self.file, offset_bytes, len_bytes)
                }
                _ => continue,
            };
            match result {
                Ok(()) => return Ok(()),
                Err(e) if device::is_unsupported(&e) => {
                    tracing::debug!(method, error = %e, "discard method unsupported; next");
                    self.discard_method.fetch_max(method + 1, Ordering::Relaxed);
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.write_zeroes(offset_bytes, len_bytes)
    }

    /// The discard of last resort: write zero pages over the range.
    fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> StoreResult<()> {
        let zeroes = AlignedBuf::zeroed(ZERO_CHUNK_BYTES);
        let calls = len_bytes.div_ceil(IO_BYTES_MAX as u64);
        for call in 0..calls {
            let at = call * IO_BYTES_MAX as u64;
            let mut left = (len_bytes - at).min(IO_BYTES_MAX as u64) as usize;
            let mut bufs: Vec<&[u8]> = Vec::with_capacity(IO_BYTES_MAX / ZERO_CHUNK_BYTES);
            while left > 0 {
                let take = left.min(ZERO_CHUNK_BYTES);
                bufs.push(&zeroes.bytes()[..take]);
                left -= take;
            }
            io::write_all_at(self.file.as_fd(), offset_bytes + at, &bufs)?;
        }
        Ok(())
    }
}

impl PageStore for FileStore {
    fn info(&self) -> StoreInfo {
        let caps =
            Caps { durable: true, discard_frees: self.discard_frees, fast: false, checked: false };
        let name = if self.direct { "file-direct" } else { "file" };
        StoreInfo { pages: self.pages, caps, name: name.into() }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        for op in ops.iter() {
            check_run(self.pages, op.page, op.buf.len())?;
        }
        let mut segs = pieces(ops.iter_mut().map(|op| (op.page, op.buf.chunks_mut(IO_BYTES_MAX))));
        let mut groups: Vec<&mut [(u64, &mut [u8])]> = Vec::new();
        let mut rest = &mut segs[..];
        while !rest.is_empty() {
            let (group, tail) = rest.split_at_mut(group_len(rest));
            groups.push(group);
            rest = tail;
        }
        groups.chunks_mut(GROUPS_PER_BATCH_MAX).try_for_each(|batch| self.read_groups(batch))
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        for op in ops {
            check_run(self.pages, op.page, op.data.len())?;
        }
        let segs = pieces(ops.iter().map(|op| (op.page, op.data.chunks(IO_BYTES_MAX))));
        let mut groups: Vec<&[(u64, &[u8])]> = Vec::new();
        let mut rest = &segs[..];
        while !rest.is_empty() {
            let (group, tail) = rest.split_at(group_len(rest));
            groups.push(group);
            rest = tail;
        }
        groups.chunks(GROUPS_PER_BATCH_MAX).try_for_each(|batch| self.write_groups(batch))
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        check_range(self.pages, page, count)?;
        if count == 0 {
            return Ok(());
        }
        let _owned = self.stripes.write(&LockSet::of_run(page, count));
        self.discard_locked(page << PAGE_SHIFT, count << PAGE_SHIFT)
    }

    fn flush(&self) -> StoreResult<()> {
        Ok(device::data_sync(&self.file)?)
    }
}

/// The runs of a batch as (first page, buffer) pieces of at most
/// `IO_BYTES_MAX`, sorted by page so that runs adjacent on disk are adjacent.
fn pieces<B, I>(runs: impl Iterator<Item = (u64, I)>) -> Vec<(u64, B)>
where
    I: Iterator<Item = B>,
{
    let mut segs = Vec::new();
    for (page, chunks) in runs {
        let first_page = |i: usize| page + (i * IO_BYTES_MAX / PAGE_SIZE) as u64;
        segs.extend(chunks.enumerate().map(|(i, chunk)| (first_page(i), chunk)));
    }
    segs.sort_unstable_by_key(|&(page, _)| page);
    segs
}

/// How many leading segments (sorted by page) form one vectored call: they
/// must be adjacent on disk and stay within the per-call limits.
fn group_len<B: AsRef<[u8]>>(segs: &[(u64, B)]) -> usize {
    assert!(!segs.is_empty());
    let mut total_bytes = segs[0].1.as_ref().len();
    let mut next_page = segs[0].0 + (total_bytes / PAGE_SIZE) as u64;
    let mut len = 1;
    for (page, buf) in &segs[1..] {
        let bytes = buf.as_ref().len();
        debug_assert!(*page >= next_page, "runs of one batch overlap at page {page}");
        if *page != next_page || len == IOVECS_MAX || total_bytes + bytes > IO_BYTES_MAX {
            break;
        }
        total_bytes += bytes;
        next_page += (bytes / PAGE_SIZE) as u64;
        len += 1;
    }
    len
}

/// First page and page count of a group of adjacent segments.
fn run_of<B: AsRef<[u8]>>(group: &[(u64, B)]) -> (u64, u64) {
    let bytes: usize = group.iter().map(|(_, b)| b.as_ref().len()).sum();
    (group[0].0, (bytes / PAGE_SIZE) as u64)
}

/// The page count of a store of `len_bytes` inside a file of `capacity_bytes`.
fn pages_of(path: &Path, len_bytes: u64, capacity_bytes: u64) -> StoreResult<u64> {
    if len_bytes == 0 || !len_bytes.is_multiple_of(PAGE_SIZE as u64) {
        let why =
            format!("size of {len_bytes} bytes is not a non-zero whole number of 4096-byte pages");
        return Err(unavailable(path, &why));
    }
    if len_bytes > capacity_bytes || i64::try_from(len_bytes).is_err() {
        let path = path.display();
        return Err(StoreError::NoSpace(format!(
            "{path} holds {capacity_bytes} bytes, not {len_bytes}"
        )));
    }
    Ok(len_bytes / PAGE_SIZE as u64)
}

fn open_options(opts: FileOptions, extra_flags: i32) -> OpenOptions {
    let direct = if opts.direct { libc::O_DIRECT } else { 0 };
    let mut oo = OpenOptions::new();
    oo.read(true).write(true).custom_flags(direct | extra_flags);
    oo
}

fn open_error(path: &Path, opts: FileOptions, err: std::io::Error) -> StoreError {
    if opts.direct && err.raw_os_error() == Some(libc::EINVAL) {
        return unavailable(
            path,
            "is on a filesystem that refuses O_DIRECT; open it without direct I/O",
        );
    }
    unavailable(path, &err.to_string())
}

fn unavailable(path: &Path, why: &str) -> StoreError {
    StoreError::Unavailable(format!("{}: {why}", path.display()))
}

/// Learn the memory alignment `O_DIRECT` needs and prove with one read that
/// direct I/O works here (some filesystems accept the flag, then refuse I/O).
fn check_direct(file: &File, path: &Path, kind: Kind) -> StoreResult<usize> {
    let no_direct = "is on a filesystem that cannot do O_DIRECT; open it without direct I/O";
    let (mem_bytes, offset_bytes) =
        device::direct_alignment(file, kind)?.ok_or_else(|| unavailable(path, no_direct))?;
    if !mem_bytes.is_power_of_two() || mem_bytes > PAGE_SIZE || offset_bytes > PAGE_SIZE {
        let why = format!(
            "O_DIRECT wants {mem_bytes}-byte buffers at {offset_bytes}-byte offsets; pages are 4096"
        );
        return Err(unavailable(path, &why));
    }
    let mut probe = AlignedBuf::zeroed(PAGE_SIZE);
    match io::read_exact_at(file.as_fd(), 0, &mut [probe.bytes_mut()]) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Err(unavailable(path, no_direct)),
        Err(e) => Err(e.into()),
        Ok(()) => Ok(mem_bytes),
    }
}

/// Whether hole punching works on this file, tried at its end, where there is
/// nothing to lose (`KEEP_SIZE` leaves the size alone).
fn punch_works(file: &File) -> StoreResult<bool> {
    let end_bytes = file.metadata()?.len();
    match device::punch_hole(file, end_bytes, PAGE_SIZE as u64) {
        Ok(()) => Ok(true),
        Err(e) if device::is_unsupported(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
