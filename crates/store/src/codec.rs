//! How a page is compressed, by the fault handler's compressed pool
//! (`memlend-fault`'s `zpool.rs`) and by the `pack` layer: lz4 (fast, the
//! default) or zstd at a low level (about twice the ratio on text, at two
//! to three times the CPU). Measured here on 4 KiB pages (one core, this
//! VM): text of short words, lz4 2149 bytes a page in 6.3 µs, decompressed
//! in 1.9 µs; zstd level 1 1037 bytes in 15.9 µs, decompressed in 7.0 µs.
//! Random printable bytes: lz4 4114 (kept by neither), zstd 3430 bytes.
//! So zstd keeps about twice the pages in the same pool where data is text,
//! and pays for it on the write-back thread and on each pool fault.

use crate::PAGE_SIZE;

/// The compression a pool uses; one codec per pool, for its whole life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Codec {
    #[default]
    Lz4,
    /// zstd at `ZSTD_LEVEL`.
    Zstd,
}

/// zstd's level: its fastest positive one. Level 3 (its default) took 6%
/// less space on text at about the same speed on a 4 KiB page, and level
/// -1 saved nothing in time on a page this small.
pub const ZSTD_LEVEL: i32 = 1;

/// The largest compressed page either codec may produce (so a scratch
/// buffer of this size never refuses a page for room).
pub fn packed_bytes_max() -> usize {
    lz4_flex::block::get_maximum_output_size(PAGE_SIZE)
        .max(zstd::zstd_safe::compress_bound(PAGE_SIZE))
}

/// A codec with its working state (zstd keeps a context: making one per
/// page would cost more than the page).
pub enum Engine {
    Lz4,
    Zstd {
        compressor: Box<zstd::bulk::Compressor<'static>>,
        decompressor: Box<zstd::bulk::Decompressor<'static>>,
    },
}

impl Engine {
    /// An engine for `codec`. zstd's contexts are small allocations; failing
    /// to make one is an allocation failure, reported as an I/O error.
    pub fn new(codec: Codec) -> std::io::Result<Engine> {
        Ok(match codec {
            Codec::Lz4 => Engine::Lz4,
            Codec::Zstd => Engine::Zstd {
                compressor: Box::new(zstd::bulk::Compressor::new(ZSTD_LEVEL)?),
                decompressor: Box::new(zstd::bulk::Decompressor::new()?),
            },
        })
    }

    /// Compress `page` into `out` (at least `packed_bytes_max()` long);
    /// its length, or None if it did not compress.
    pub fn compress(&mut self, page: &[u8], out: &mut [u8]) -> Option<usize> {
        match self {
            Engine::Lz4 => lz4_flex::block::compress_into(page, out).ok(),
            Engine::Zstd { compressor, .. } => compressor.compress_to_buffer(page, out).ok(),
        }
    }

    /// Decompress `packed` into `out` (a page); the length it came to, or
    /// an error in words.
    pub fn decompress(&mut self, packed: &[u8], out: &mut [u8]) -> Result<usize, String> {
        match self {
            Engine::Lz4 => lz4_flex::block::decompress_into(packed, out).map_err(|e| e.to_string()),
            Engine::Zstd { decompressor, .. } => {
                decompressor.decompress_to_buffer(packed, out).map_err(|e| e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_page() -> Vec<u8> {
        let words = ["page", "donor", "fault", "memory", "store", "the", "a"];
        let mut page = Vec::with_capacity(PAGE_SIZE);
        let mut i = 0usize;
        while page.len() < PAGE_SIZE {
            page.extend_from_slice(words[(i * 7 + i / 3) % words.len()].as_bytes());
            page.push(b' ');
            i += 1;
        }
        page.truncate(PAGE_SIZE);
        page
    }

    #[test]
    fn each_codec_gives_back_the_page_it_was_given() {
        let page = text_page();
        for codec in [Codec::Lz4, Codec::Zstd] {
            let mut engine = Engine::new(codec).unwrap();
            let mut packed = vec![0; packed_bytes_max()];
            let len = engine.compress(&page, &mut packed).unwrap();
            assert!(len < PAGE_SIZE / 2, "{codec:?}: text compressed to only {len}");
            let mut back = vec![0; PAGE_SIZE];
            assert_eq!(engine.decompress(&packed[..len], &mut back), Ok(PAGE_SIZE));
            assert_eq!(back, page, "{codec:?}");
        }
    }

    #[test]
    fn bytes_that_are_not_a_compressed_page_are_an_error_not_a_page() {
        for codec in [Codec::Lz4, Codec::Zstd] {
            let mut engine = Engine::new(codec).unwrap();
            let mut back = vec![0; PAGE_SIZE];
            let garbage = [0xffu8; 64];
            let got = engine.decompress(&garbage, &mut back);
            assert!(got.as_ref().map_or(true, |&n| n != PAGE_SIZE), "{codec:?}: {got:?}");
        }
    }
}
