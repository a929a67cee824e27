//! `crypt`: every page encrypted and authenticated here, so that the store
//! below (a donor's memory, a file) only ever holds ciphertext.
//!
//! Cipher. AES-256-GCM from `ring`, chosen by measurement on this project's
//! machine (AES-NI, CLMUL, VAES; 4 KiB pages, one thread, release): `ring`
//! seals at 6.0-7.8 GB/s (0.5-0.7 µs a page), RustCrypto's `aes-gcm` at
//! 1.5-2.0 GB/s (2.0-2.8 µs) and `chacha20poly1305` at ~1.0 GB/s
//! (`examples/aead_speed.rs`). With `aes-gcm` a far-memory run lost 12-35%
//! of its random-touch rate to encryption, over the 10% goal.
//! The key is the caller's, fresh and random per region.
//!
//! Nonces. GCM falls apart if one (key, nonce) pair ever seals two different
//! pages: their XOR leaks and tags can be forged. So each page *version* has
//! its own 96-bit nonce: the page index in the low 40 bits (stores of more
//! than 2^40 pages are refused) and the page's version above it. The
//! version counts the page's writes in this process and never goes back:
//! not on discard (which sets a flag instead), not on a failed write. It
//! has 47 bits: a page that would need version 2^47 refuses the write
//! (`NoSpace`). At one write-back of the same page every microsecond, far
//! faster than a page can be evicted and faulted back, that is 4.4 years.
//!
//! Tags travel with the pages. The store below is a [`SidecarStore`]: a
//! donor keeps each page's 16-byte tag beside its ciphertext (`remote`), or
//! `local_tags` keeps it here for a store without a sidecar. This process
//! keeps only the version: 6 bytes a page, in zero-initialised tables that
//! cost no memory until touched. That is enough: the nonce names the page
//! and its version, so anything but the last ciphertext of that very page
//! with its own tag fails verification: a flipped bit, an older ciphertext
//! and tag of the page (a rollback: the version it was sealed under is not
//! the one we hold), another page's (a swap), another region's. A failure
//! is `StoreError::Corrupt` (with the low 32 bits of the version we hold as
//! `expected`, 0 as `actual`), counted in `corrupt_pages` and logged. The
//! caller's buffer is zeroed for that page.
//!
//! Zero pages. Version 0 means never written, and the `DISCARDED` flag means
//! discarded: such pages read as zeroes with no check. The inner store is
//! still read with the rest of the batch (simpler: one inner read per
//! batch), and its bytes are replaced.
//!
//! Concurrency. A page's ciphertext and tag below and its version here are
//! two things that must change together, so:
//! - writers and discarders own the pages' stripe locks across encryption,
//!   the version update and the inner write;
//! - readers share the stripes across the inner read and the decryption,
//!   which then always pairs a ciphertext with its own version.
//!   Readers of pages that race a writer wait for the writer (~2 µs a page
//!   of encryption plus the inner write), instead of retrying as `checksum`
//!   does: a retry would cost a second decryption, far more than the wait.
//!
//! The locks order everything, so the versions need only relaxed atomics.
//! A version is recorded as its page is sealed, before the inner write: the
//! lock hides the order from readers, and a failed inner write must not
//! give its versions back, since its ciphertext may have reached the donor.
//! Pages that such a write did not reach read as `Corrupt` until rewritten.

use super::table::zeroed;
use crate::page_locks::{LockSet, PageLocks};
use crate::{batch_pages, check_range, check_run, PageStore, ReadOp, Sidecar, SidecarStore};
use crate::{StoreError, StoreInfo, StoreResult, WriteOp, PAGE_SIZE, SIDECAR_LEN};
use parking_lot::Mutex;
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Ciphertext buffers kept for reuse, and the largest kept: a fresh
/// `vec![0; n]` per batch was zeroed (or faulted in) page by page only to
/// be overwritten, and grew a malloc arena per writing thread.
const SPARE_BUFS: usize = 4;
const SPARE_BUF_MAX_BYTES: usize = 8 << 20;
/// Reads of up to this many pages keep their tags on the stack.
const STACK_TAGS: usize = 16;

/// Bits of the nonce that hold the page index; the rest hold the version.
const PAGE_BITS: u32 = 40;
/// Bits of a page's version word: 47 of version and the `DISCARDED` flag.
const WORD_BITS: u32 = 48;
/// Largest version a page may reach.
const VERSION_MAX: u64 = (1 << (WORD_BITS - 1)) - 1;
/// Flag in a page's version word: discarded, reads as zeroes. The version
/// stays, so the next write still takes a fresh nonce.
const DISCARDED: u64 = 1 << (WORD_BITS - 1);

/// Wraps `S` and keeps every page in it encrypted under the caller's key;
/// see the module documentation for the nonce and concurrency arguments.
pub struct Crypt<S> {
    inner: S,
    cipher: LessSafeKey,
    versions: Versions,
    stripes: PageLocks,
    corrupt_pages: AtomicU64,
    spare: Mutex<Vec<(Vec<u8>, Vec<Sidecar>)>>,
}

/// Each page's 48-bit version word (version and `DISCARDED`), split in two
/// tables so that a page costs 6 bytes; all zero for a fresh page.
struct Versions {
    low: Box<[AtomicU32]>,
    high: Box<[AtomicU16]>,
}

impl Versions {
    fn new(pages: u64) -> StoreResult<Self> {
        Ok(Versions { low: zeroed(pages, "versions")?, high: zeroed(pages, "versions")? })
    }

    fn get(&self, page: u64) -> u64 {
        let i = page as usize;
        u64::from(self.low[i].load(Relaxed)) | u64::from(self.high[i].load(Relaxed)) << 32
    }

    fn set(&self, page: u64, word: u64) {
        debug_assert!(word < 1 << WORD_BITS);
        let i = page as usize;
        self.low[i].store(word as u32, Relaxed);
        self.high[i].store((word >> 32) as u16, Relaxed);
    }

    fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.low) + std::mem::size_of_val(&*self.high)
    }
}

impl<S: SidecarStore> Crypt<S> {
    /// Per-page metadata this layer keeps in memory (its sidecar aside,
    /// which the store below holds).
    pub const METADATA_BYTES_PER_PAGE: usize = 6;
    /// Largest store this layer can wrap: the page index must fit the nonce.
    pub const PAGES_MAX: u64 = 1 << PAGE_BITS;

    /// Wrap `inner`, encrypting under `key`. What `inner` holds now is
    /// ignored: every page reads as zeroes until written through the layer.
    /// The key must be random and never given to another `Crypt`, in this
    /// process or any other: nonces are unique only within one layer.
    pub fn new(inner: S, key: [u8; 32]) -> StoreResult<Self> {
        let pages = inner.info().pages;
        if pages > Self::PAGES_MAX {
            return Err(StoreError::NoSpace(format!(
                "crypt: a store of {pages} pages is over the limit of 2^{PAGE_BITS}"
            )));
        }
        Ok(Crypt {
            inner,
            cipher: LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).expect("a 32-byte key")),
            versions: Versions::new(pages)?,
            stripes: PageLocks::new(),
            corrupt_pages: AtomicU64::new(0),
            spare: Mutex::new(Vec::new()),
        })
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Pages that failed authentication, since the layer was made.
    pub fn corrupt_pages(&self) -> u64 {
        self.corrupt_pages.load(Relaxed)
    }

    /// Bytes of per-page metadata this layer holds (the fixed stripe table
    /// aside).
    pub fn metadata_bytes(&self) -> usize {
        self.versions.bytes()
    }

    fn pages(&self) -> u64 {
        self.versions.low.len() as u64
    }

    /// The version the next write of `page` takes. The caller owns its stripe.
    fn next_version(&self, page: u64) -> StoreResult<u64> {
        let version = self.versions.get(page) & VERSION_MAX;
        if version == VERSION_MAX {
            return Err(StoreError::NoSpace(format!(
                "crypt: page {page} has used all 2^47 versions of its nonce"
            )));
        }
        Ok(version + 1)
    }

    /// Encrypt in place the plaintext of `ops`, which `sealed` holds in
    /// order, under each page's next version; record the versions and put
    /// the tags in `tags`. The caller owns the stripes.
    fn seal(&self, ops: &[WriteOp<'_>], sealed: &mut [u8], tags: &mut Vec<Sidecar>) {
        let pages = ops
            .iter()
            .flat_map(|op| (0..(op.data.len() / PAGE_SIZE) as u64).map(move |i| op.page + i));
        for (page, dst) in pages.zip(sealed.chunks_exact_mut(PAGE_SIZE)) {
            // Recorded page by page, so that a page named twice in one batch
            // (which callers must not do) still takes two nonces.
            let version = self.versions.get(page) & VERSION_MAX;
            debug_assert!(version < VERSION_MAX, "checked by write_sealed");
            let version = version + 1;
            let tag =
                (self.cipher.seal_in_place_separate_tag(nonce(page, version), Aad::empty(), dst))
                    .expect("a page is far below GCM's message limit");
            self.versions.set(page, version);
            tags.push(tag.as_ref().try_into().expect("a 16-byte tag"));
        }
    }

    /// Decrypt one page read from the store, in place, against the tag
    /// that came with it; false if the tag does not match. The caller
    /// shares its stripe.
    fn open(&self, page: u64, buf: &mut [u8], tag: &Sidecar) -> bool {
        let word = self.versions.get(page);
        if word == 0 || word & DISCARDED != 0 {
            buf.fill(0);
            return true;
        }
        let tag = Tag::from(*tag);
        let nonce = nonce(page, word);
        self.cipher.open_in_place_separate_tag(nonce, Aad::empty(), tag, buf, 0..).is_ok()
    }

    /// Read `page` into `buf` once more and open it: a page that failed its
    /// tag may have been damaged on the way (the page protocol leaves a
    /// sealed page's check to its tag). A second failure is what the store
    /// holds: counted, logged, and `Corrupt`.
    fn reread(&self, page: u64, buf: &mut [u8]) -> StoreResult<()> {
        let mut tag = [[0u8; SIDECAR_LEN]];
        let again = self.inner.read_with(&mut [ReadOp { page, buf: &mut *buf }], &mut tag);
        if again.is_ok() && self.open(page, buf, &tag[0]) {
            return Ok(());
        }
        buf.fill(0);
        self.corrupt_pages.fetch_add(1, Relaxed);
        let word = self.versions.get(page);
        tracing::warn!(page, version = word, "page failed authentication: not what was written");
        Err(StoreError::Corrupt { page, expected: word as u32, actual: 0 })
    }

    /// Seal `sealed` (the batch's plaintext, in order) in place under the
    /// stripes' locks, record the versions and write ciphertext and tags
    /// below.
    fn write_sealed(
        &self,
        ops: &[WriteOp<'_>],
        set: &LockSet,
        sealed: &mut [u8],
        tags: &mut Vec<Sidecar>,
    ) -> StoreResult<()> {
        let _owned = self.stripes.write(set);
        // Refuse the whole batch before changing anything if a page is out
        // of versions, so that no page is left sealed but never written.
        for op in ops {
            for page in op.page..op.page + (op.data.len() / PAGE_SIZE) as u64 {
                self.next_version(page)?;
            }
        }
        self.seal(ops, sealed, tags);
        let mut rest = &sealed[..];
        let sealed_ops: Vec<WriteOp<'_>> = (ops.iter())
            .map(|op| {
                let (data, tail) = rest.split_at(op.data.len());
                rest = tail;
                WriteOp { page: op.page, data }
            })
            .collect();
        self.inner.write_with(&sealed_ops, tags)
    }

    /// Read and open every page of `ops` under shared stripes; `tags` has
    /// room for one tag per page.
    fn read_into(&self, ops: &mut [ReadOp<'_>], tags: &mut [Sidecar]) -> StoreResult<()> {
        self.inner.read_with(ops, tags)?;
        let mut first_error = None;
        let mut tags = tags.iter();
        for op in ops.iter_mut() {
            for (i, chunk) in op.buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
                let tag = tags.next().expect("one tag a page");
                let page = op.page + i as u64;
                if !self.open(page, chunk, tag) {
                    if let Err(e) = self.reread(page, chunk) {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The nonce of one page version: `page | version << 40`, little-endian.
fn nonce(page: u64, version: u64) -> Nonce {
    debug_assert!(page < 1 << PAGE_BITS && (1..=VERSION_MAX).contains(&version));
    let value = u128::from(page) | (u128::from(version) << PAGE_BITS);
    let bytes: [u8; 12] = value.to_le_bytes()[..12].try_into().expect("12 of 16 bytes");
    Nonce::assume_unique_for_key(bytes)
}

impl<S: SidecarStore> PageStore for Crypt<S> {
    fn info(&self) -> StoreInfo {
        let inner = self.inner.info();
        let caps = crate::Caps { checked: true, ..inner.caps };
        StoreInfo { name: format!("crypt({})", inner.name), caps, ..inner }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        let mut set = LockSet::new();
        for op in ops.iter() {
            set.add_run(op.page, check_run(self.pages(), op.page, op.buf.len())?);
        }
        let pages = batch_pages(ops.iter().map(|op| op.buf.len()));
        let _shared = self.stripes.read(&set);
        if pages <= STACK_TAGS {
            let mut tags = [[0u8; SIDECAR_LEN]; STACK_TAGS];
            return self.read_into(ops, &mut tags[..pages]);
        }
        self.read_into(ops, &mut vec![[0u8; SIDECAR_LEN]; pages])
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        let mut set = LockSet::new();
        for op in ops {
            set.add_run(op.page, check_run(self.pages(), op.page, op.data.len())?);
        }
        // One ciphertext buffer per batch, filled with the plaintext before
        // the locks are taken and sealed in place under them.
        let (mut sealed, mut tags) = self.spare.lock().pop().unwrap_or_default();
        sealed.clear();
        tags.clear();
        ops.iter().for_each(|op| sealed.extend_from_slice(op.data));
        let result = self.write_sealed(ops, &set, &mut sealed, &mut tags);
        if sealed.capacity() <= SPARE_BUF_MAX_BYTES {
            let mut spare = self.spare.lock();
            if spare.len() < SPARE_BUFS {
                spare.push((sealed, tags));
            }
        }
        result
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        check_range(self.pages(), page, count)?;
        let _owned = self.stripes.write(&LockSet::of_run(page, count));
        // Zero here first: the pages read as zeroes even if the inner
        // discard fails part-way, and the donor keeps only ciphertext anyway.
        // A page never written is left alone, so its table memory stays
        // untouched.
        for p in page..page + count {
            let word = self.versions.get(p);
            if word != 0 {
                self.versions.set(p, word | DISCARDED);
            }
        }
        self.inner.discard(page, count)
    }

    fn flush(&self) -> StoreResult<()> {
        self.inner.flush()
    }
}

/// What this layer adds, in a named stack's help and errors.
pub(crate) const ADDS: &str = "AES-256-GCM under a fresh key, tags kept here";

/// This layer in a named stack (`registry.rs`): a fresh random key, and
/// the tags kept in this process (`LocalTags`), since the store below may
/// be a file or a stack of donors and only pages move through it.
pub(crate) fn named(
    base: Arc<dyn PageStore>,
    reports: &mut Vec<super::report::Report>,
) -> StoreResult<Arc<dyn PageStore>> {
    let mut key = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
        .map_err(|_| StoreError::Io(std::io::Error::other("no random key for the crypt layer")))?;
    let layer = Arc::new(Crypt::new(super::LocalTags::new(base)?, key)?);
    let seen = Arc::clone(&layer);
    reports.push(Box::new(move || format!("crypt: {} corrupt pages", seen.corrupt_pages())));
    Ok(layer)
}

#[cfg(test)]
#[path = "crypt_tests.rs"]
mod tests;
