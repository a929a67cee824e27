//! The page store: one small interface over a linear space of 4 KiB pages.
//!
//! Everything that holds pages implements [`PageStore`]: backends hold bytes
//! (`ram`, `file`, and `remote` in its own crate), layers wrap a store and add
//! one property each (`checksum`, `stats`). Front-ends (the NBD export, the
//! page server, the fault handler) only ever see `dyn PageStore`. This is
//! nbdkit's plugin/filter split: a new backend or layer needs no change
//! anywhere else.

pub mod codec;
mod error;
pub mod file;
pub mod layer;
pub mod page_locks;
pub mod ram;

pub use error::{StoreError, StoreResult};

/// The unit of every store: a 4 KiB page.
pub const PAGE_SIZE: usize = 4096;
/// `PAGE_SIZE` as a shift, for offset arithmetic.
pub const PAGE_SHIFT: u32 = 12;

/// What a store can do beyond read and write. A bit set, kept as a plain
/// struct of bools so call sites read clearly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    /// `flush` makes earlier writes durable (a file store); false means flush
    /// is a no-op because nothing is ever durable (RAM).
    pub durable: bool,
    /// `discard` frees the backing space rather than only writing zeroes.
    pub discard_frees: bool,
    /// Operations finish in about a memcpy's time. Front-ends may then serve
    /// requests inline on the connection thread instead of handing them to a
    /// worker, which costs ~10 µs per cross-core hand-off on these machines.
    pub fast: bool,
    /// Every page read is verified here (an AEAD tag, a checksum): a page
    /// the store cannot vouch for fails the read with `Corrupt` and is
    /// zeroed in the caller's buffer, while the batch's other pages are
    /// returned. Never wrong bytes. A mirror of such stores needs no sums
    /// of its own.
    pub checked: bool,
}

/// Size and capabilities of a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreInfo {
    /// Number of 4 KiB pages; valid page indices are `0..pages`.
    pub pages: u64,
    pub caps: Caps,
    /// A short description for logs, e.g. `checksum(ram)`.
    pub name: String,
}

/// One run of consecutive pages to read into `buf`
/// (`buf.len()` is a non-zero multiple of [`PAGE_SIZE`]).
pub struct ReadOp<'a> {
    pub page: u64,
    pub buf: &'a mut [u8],
}

/// One run of consecutive pages to write from `data`
/// (`data.len()` is a non-zero multiple of [`PAGE_SIZE`]).
pub struct WriteOp<'a> {
    pub page: u64,
    pub data: &'a [u8],
}

/// The interface every backend and layer implements.
///
/// Batches are scatter/gather lists of page runs; a store may execute the runs
/// in any order or in parallel. Runs within one batch must not overlap
/// (callers guarantee it; stores may assume it). A single page is atomic with
/// respect to concurrent readers of the same store: a read never returns half
/// of one write and half of another.
pub trait PageStore: Send + Sync {
    fn info(&self) -> StoreInfo;
    /// Read every run of `ops`. Pages never written read as zeroes.
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()>;
    /// Write every run of `ops`.
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()>;
    /// Pages `page..page + count` read as zeroes afterwards. Stores that can
    /// free the space do (`Caps::discard_frees`).
    fn discard(&self, page: u64, count: u64) -> StoreResult<()>;
    /// Make every completed write durable, where the store has durability.
    fn flush(&self) -> StoreResult<()>;
    /// The memory that holds `page..page + count`, for a store that keeps
    /// its pages in this process (`ram`) and lends it to be sent without a
    /// copy; None for the others. See [`InPlace`] for what it promises.
    fn in_place(&self, _page: u64, _count: u64) -> Option<StoreResult<InPlace>> {
        None
    }
    /// Which of `page..page + count` hold data: `out` is replaced by runs
    /// `(pages, allocated)` that follow each other from `page`, neighbours
    /// differing. A run not `allocated` reads as zeroes and holds no space.
    /// The runs may cover fewer than `count` pages (never none, for a
    /// non-empty range in bounds). None when the store does not know; the
    /// caller must then take every page as data, which is always a correct
    /// answer. A layer that maps pages elsewhere or changes their bytes
    /// must not pass this through. What it returns may be stale by the
    /// time it is used if writers race it, as for any read.
    fn allocation(
        &self,
        _page: u64,
        _count: u64,
        _out: &mut Vec<(u64, bool)>,
    ) -> Option<StoreResult<()>> {
        None
    }
}

/// Pages lent by [`PageStore::in_place`]: `len` bytes at `ptr`, mapped for
/// as long as the store that lent them lives. No lock is held, so writers
/// may change them at any time: they may be handed to the kernel (a
/// `writev` to a socket), never read through a Rust reference, and only
/// where whoever receives them checks them (a sealed page's AEAD tag).
#[derive(Clone, Copy, Debug)]
pub struct InPlace {
    pub ptr: *const u8,
    pub len: usize,
}

/// Bytes of the sidecar a [`SidecarStore`] keeps beside each page: an AEAD
/// tag (`crypt`).
pub const SIDECAR_LEN: usize = 16;
/// One page's sidecar.
pub type Sidecar = [u8; SIDECAR_LEN];

/// A store that keeps a small sidecar beside every page, written and read
/// together with it. `crypt` keeps its tags there, so that a donor, not the
/// borrower's memory, holds them. `side` has one entry per page of `ops`,
/// in order. A page never written, or discarded, reads an all-zero sidecar.
/// Sidecar and page change together for every reader that does not race a
/// writer of the same page (callers order those, as `crypt` does).
pub trait SidecarStore: PageStore {
    fn read_with(&self, ops: &mut [ReadOp<'_>], side: &mut [Sidecar]) -> StoreResult<()>;
    fn write_with(&self, ops: &[WriteOp<'_>], side: &[Sidecar]) -> StoreResult<()>;
    /// The sidecars of `page..page + side.len()` into `side`, and their
    /// pages lent in place ([`PageStore::in_place`]); None if the pages
    /// cannot be lent. Page and sidecar may not match if a writer races:
    /// the reader's tag check catches that.
    fn read_tags_in_place(
        &self,
        _page: u64,
        _side: &mut [Sidecar],
    ) -> Option<StoreResult<InPlace>> {
        None
    }
}

/// Pages in a batch of runs.
pub fn batch_pages(lens: impl IntoIterator<Item = usize>) -> usize {
    lens.into_iter().map(|len| len / PAGE_SIZE).sum()
}

/// Check that a run lies inside a store of `pages` pages and is whole pages.
/// Every backend calls this before touching memory: it is the bounds check
/// that keeps a bad request from reaching past a slab.
pub fn check_run(pages: u64, page: u64, len_bytes: usize) -> StoreResult<u64> {
    if len_bytes == 0 || !len_bytes.is_multiple_of(PAGE_SIZE) {
        return Err(StoreError::Misaligned { len_bytes });
    }
    let count = (len_bytes / PAGE_SIZE) as u64;
    check_range(pages, page, count)?;
    Ok(count)
}

/// Check that `page..page + count` lies inside a store of `pages` pages.
pub fn check_range(pages: u64, page: u64, count: u64) -> StoreResult<()> {
    match page.checked_add(count) {
        Some(end) if end <= pages => Ok(()),
        _ => Err(StoreError::OutOfRange { page, count, pages }),
    }
}

impl<S: SidecarStore + ?Sized> SidecarStore for std::sync::Arc<S> {
    fn read_with(&self, ops: &mut [ReadOp<'_>], side: &mut [Sidecar]) -> StoreResult<()> {
        (**self).read_with(ops, side)
    }
    fn write_with(&self, ops: &[WriteOp<'_>], side: &[Sidecar]) -> StoreResult<()> {
        (**self).write_with(ops, side)
    }
    fn read_tags_in_place(&self, page: u64, side: &mut [Sidecar]) -> Option<StoreResult<InPlace>> {
        (**self).read_tags_in_place(page, side)
    }
}

impl<S: PageStore + ?Sized> PageStore for std::sync::Arc<S> {
    fn info(&self) -> StoreInfo {
        (**self).info()
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        (**self).read(ops)
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        (**self).write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        (**self).discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        (**self).flush()
    }
    fn in_place(&self, page: u64, count: u64) -> Option<StoreResult<InPlace>> {
        (**self).in_place(page, count)
    }
    fn allocation(
        &self,
        page: u64,
        count: u64,
        out: &mut Vec<(u64, bool)>,
    ) -> Option<StoreResult<()>> {
        (**self).allocation(page, count, out)
    }
}
