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
//! than 2^40 pages are refused) and the page's version in the high 56 bits.
//! The version counts the page's writes in this process and never goes back:
//! not on discard (which sets a flag instead), not on a failed write. A page
//! that would need version 2^56 refuses the write (`NoSpace`); at one write
//! a microsecond that is two thousand years away.
//!
//! Tags stay here. Per page this process keeps the version and the 16-byte
//! tag (24 bytes, in a zero-initialised table that costs no memory until
//! touched); the store below holds bare ciphertext. Since the nonce names
//! the page and the version and the tag is local, anything but the last
//! ciphertext of that very page fails verification: a flipped bit, an older
//! ciphertext of the page (a rollback), another page's ciphertext (a swap),
//! another region's. A failure is `StoreError::Corrupt` (with the first 32
//! bits of the tag we hold as `expected`, the CRC32C of the bytes the store
//! returned as `actual`, for matching against the donor's copy), counted in
//! `corrupt_pages` and logged. The caller's buffer is zeroed for that page.
//!
//! Zero pages. Version 0 means never written, and the `DISCARDED` flag means
//! discarded: such pages read as zeroes with no check. The inner store is
//! still read with the rest of the batch (simpler: one inner read per
//! batch), and its bytes are replaced.
//!
//! Concurrency. A page's ciphertext below and its (version, tag) here are
//! two things that must change together, so:
//! - writers and discarders own the pages' stripe locks across encryption,
//!   the metadata update and the inner write;
//! - readers share the stripes across the inner read and the decryption,
//!   which then always pairs a ciphertext with its own version and tag.
//!   Readers of pages that race a writer wait for the writer (~2 µs a page
//!   of encryption plus the inner write), instead of retrying as `checksum`
//!   does: a retry would cost a second decryption, far more than the wait.
//!
//! The locks order everything, so the metadata needs only relaxed atomics.
//! The metadata is recorded as each page is sealed, before the inner write:
//! the lock hides the order from readers, and a failed inner write must not
//! give its versions back, since its ciphertext may have reached the donor.
//! Pages that such a write did not reach read as `Corrupt` until rewritten.

use super::{StripeLocks, StripeSet};
use crate::{check_range, check_run, PageStore, ReadOp, StoreError, StoreInfo, StoreResult};
use crate::{WriteOp, PAGE_SIZE};
use parking_lot::Mutex;
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Ciphertext buffers kept for reuse, and the largest kept: a fresh
/// `vec![0; n]` per batch was zeroed (or faulted in) page by page only to
/// be overwritten, and grew a malloc arena per writing thread.
const SPARE_BUFS: usize = 4;
const SPARE_BUF_MAX_BYTES: usize = 8 << 20;

/// Bits of the nonce that hold the page index; the rest hold the version.
const PAGE_BITS: u32 = 40;
/// Largest version a page may reach: the nonce's other 56 bits.
const MAX_VERSION: u64 = (1 << 56) - 1;
/// Flag in a page's version word: discarded, reads as zeroes. The version
/// stays, so the next write still takes a fresh nonce.
const DISCARDED: u64 = 1 << 63;

/// Wraps `S` and keeps every page in it encrypted under the caller's key;
/// see the module documentation for the nonce and concurrency arguments.
pub struct Crypt<S> {
    inner: S,
    cipher: LessSafeKey,
    meta: Box<[PageMeta]>,
    stripes: StripeLocks,
    corrupt_pages: AtomicU64,
    spare: Mutex<Vec<Vec<u8>>>,
}

/// What this process remembers of one page; all zero for a fresh page.
struct PageMeta {
    /// The version of the page's contents (low 56 bits), and `DISCARDED`.
    word: AtomicU64,
    /// The tag of that version, as two little-endian halves.
    tag: [AtomicU64; 2],
}

impl<S: PageStore> Crypt<S> {
    /// In-memory metadata per page of the store.
    pub const METADATA_BYTES_PER_PAGE: usize = std::mem::size_of::<PageMeta>();
    /// Largest store this layer can wrap: the page index must fit the nonce.
    pub const MAX_PAGES: u64 = 1 << PAGE_BITS;

    /// Wrap `inner`, encrypting under `key`. What `inner` holds now is
    /// ignored: every page reads as zeroes until written through the layer.
    /// The key must be random and never given to another `Crypt`, in this
    /// process or any other: nonces are unique only within one layer.
    pub fn new(inner: S, key: [u8; 32]) -> StoreResult<Self> {
        let pages = inner.info().pages;
        if pages > Self::MAX_PAGES {
            return Err(StoreError::NoSpace(format!(
                "crypt: a store of {pages} pages is over the limit of 2^{PAGE_BITS}"
            )));
        }
        Ok(Crypt {
            inner,
            cipher: LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).expect("a 32-byte key")),
            meta: super::table::zeroed(pages, "tags")?,
            stripes: StripeLocks::new(),
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
        std::mem::size_of_val(&*self.meta)
    }

    fn pages(&self) -> u64 {
        self.meta.len() as u64
    }

    /// The version the next write of `page` takes. The caller owns its stripe.
    fn next_version(&self, page: u64) -> StoreResult<u64> {
        let version = self.meta[page as usize].word.load(Relaxed) & MAX_VERSION;
        if version == MAX_VERSION {
            return Err(StoreError::NoSpace(format!(
                "crypt: page {page} has used all 2^56 versions of its nonce"
            )));
        }
        Ok(version + 1)
    }

    /// Encrypt every page of `ops` into `sealed` under its next version and
    /// record version and tag. The caller owns the stripes.
    /// Encrypt in place the plaintext of `ops`, which `sealed` holds in order.
    fn seal(&self, ops: &[WriteOp<'_>], sealed: &mut [u8]) -> StoreResult<()> {
        let pages = ops
            .iter()
            .flat_map(|op| (0..(op.data.len() / PAGE_SIZE) as u64).map(move |i| op.page + i));
        for (page, dst) in pages.zip(sealed.chunks_exact_mut(PAGE_SIZE)) {
            // Recorded page by page, so that a page named twice in one batch
            // (which callers must not do) still takes two nonces.
            let version = self.next_version(page)?;
            let tag =
                (self.cipher.seal_in_place_separate_tag(nonce(page, version), Aad::empty(), dst))
                    .expect("a page is far below GCM's message limit");
            self.meta[page as usize].record(version, &tag);
        }
        Ok(())
    }

    /// Decrypt one page read from the store, in place. The caller shares
    /// its stripe.
    fn open(&self, page: u64, buf: &mut [u8]) -> StoreResult<()> {
        let meta = &self.meta[page as usize];
        let word = meta.word.load(Relaxed);
        if word == 0 || word & DISCARDED != 0 {
            buf.fill(0);
            return Ok(());
        }
        let (version, tag) = (word, meta.tag());
        let expected = u32::from_le_bytes(tag.as_ref()[..4].try_into().expect("a 16-byte tag"));
        let opened = self.cipher.open_in_place_separate_tag(
            nonce(page, version),
            Aad::empty(),
            tag,
            buf,
            0..,
        );
        if opened.is_ok() {
            return Ok(());
        }
        // What `buf` holds after a failed open is unspecified: no CRC of it.
        let actual = 0;
        buf.fill(0);
        self.corrupt_pages.fetch_add(1, Relaxed);
        tracing::warn!(page, version, "page failed authentication: not what was written");
        Err(StoreError::Corrupt { page, expected, actual })
    }
}

impl PageMeta {
    fn record(&self, version: u64, tag: &Tag) {
        let (low, high) = tag.as_ref().split_at(8);
        self.word.store(version, Relaxed);
        self.tag[0].store(u64::from_le_bytes(low.try_into().expect("8 bytes")), Relaxed);
        self.tag[1].store(u64::from_le_bytes(high.try_into().expect("8 bytes")), Relaxed);
    }

    fn tag(&self) -> Tag {
        let mut tag = [0u8; 16];
        tag[..8].copy_from_slice(&self.tag[0].load(Relaxed).to_le_bytes());
        tag[8..].copy_from_slice(&self.tag[1].load(Relaxed).to_le_bytes());
        Tag::from(tag)
    }

    /// Make the page read as zeroes, keeping its version. A page never
    /// written is left alone: storing into it would make the table's memory
    /// resident for nothing.
    fn discard(&self) {
        let word = self.word.load(Relaxed);
        if word != 0 {
            self.word.store(word | DISCARDED, Relaxed);
            self.tag[0].store(0, Relaxed);
            self.tag[1].store(0, Relaxed);
        }
    }
}

impl<S: PageStore> Crypt<S> {
    /// Seal `sealed` (the batch's plaintext, in order) in place under the
    /// stripes' locks, record the versions and write the ciphertext below.
    fn write_sealed(
        &self,
        ops: &[WriteOp<'_>],
        set: &StripeSet,
        sealed: &mut [u8],
    ) -> StoreResult<()> {
        let _owned = self.stripes.write(set);
        // Refuse the whole batch before changing anything if a page is out
        // of versions, so that no page is left sealed but never written.
        for op in ops {
            for page in op.page..op.page + (op.data.len() / PAGE_SIZE) as u64 {
                self.next_version(page)?;
            }
        }
        self.seal(ops, sealed)?;
        let mut rest = &sealed[..];
        let sealed_ops: Vec<WriteOp<'_>> = (ops.iter())
            .map(|op| {
                let (data, tail) = rest.split_at(op.data.len());
                rest = tail;
                WriteOp { page: op.page, data }
            })
            .collect();
        self.inner.write(&sealed_ops)
    }
}

/// The nonce of one page version: `page | version << 40`, little-endian.
fn nonce(page: u64, version: u64) -> Nonce {
    debug_assert!(page < 1 << PAGE_BITS && (1..=MAX_VERSION).contains(&version));
    let value = u128::from(page) | (u128::from(version) << PAGE_BITS);
    let bytes: [u8; 12] = value.to_le_bytes()[..12].try_into().expect("12 of 16 bytes");
    Nonce::assume_unique_for_key(bytes)
}

impl<S: PageStore> PageStore for Crypt<S> {
    fn info(&self) -> StoreInfo {
        let inner = self.inner.info();
        StoreInfo { name: format!("crypt({})", inner.name), ..inner }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        let mut set = StripeSet::new();
        for op in ops.iter() {
            set.add_run(op.page, check_run(self.pages(), op.page, op.buf.len())?);
        }
        let _shared = self.stripes.read(&set);
        self.inner.read(ops)?;
        let mut first_error = None;
        for op in ops.iter_mut() {
            for (i, chunk) in op.buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
                if let Err(e) = self.open(op.page + i as u64, chunk) {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        let mut set = StripeSet::new();
        for op in ops {
            set.add_run(op.page, check_run(self.pages(), op.page, op.data.len())?);
        }
        // One ciphertext buffer per batch, filled with the plaintext before
        // the locks are taken and sealed in place under them.
        let mut sealed = self.spare.lock().pop().unwrap_or_default();
        sealed.clear();
        ops.iter().for_each(|op| sealed.extend_from_slice(op.data));
        let result = self.write_sealed(ops, &set, &mut sealed);
        if sealed.capacity() <= SPARE_BUF_MAX_BYTES {
            let mut spare = self.spare.lock();
            if spare.len() < SPARE_BUFS {
                spare.push(sealed);
            }
        }
        result
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        check_range(self.pages(), page, count)?;
        let _owned = self.stripes.write(&StripeSet::of_run(page, count));
        // Zero here first: the pages read as zeroes even if the inner
        // discard fails part-way, and the donor keeps only ciphertext anyway.
        for p in page..page + count {
            self.meta[p as usize].discard();
        }
        self.inner.discard(page, count)
    }

    fn flush(&self) -> StoreResult<()> {
        self.inner.flush()
    }
}

// SAFETY: PageMeta is three AtomicU64; all-zero bytes are three zeroes.
unsafe impl super::table::ZeroValid for PageMeta {}

#[cfg(test)]
#[path = "crypt_tests.rs"]
mod tests;
