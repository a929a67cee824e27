//! `stripe`: one store over several, page chunks dealt round-robin, so that
//! a region's pages and bandwidth spread over several donors.
//!
//! Chunk `c` (pages `c * chunk_pages ..`) lives on store `c % n` at local
//! chunk `c / n`. A batch is split by store; each store gets one call, and
//! when a batch touches several stores their calls run at the same time, so
//! a batch costs the slowest donor's round trip, not the sum. A one-store
//! batch (one page, say) stays on the caller's thread: no hand-off.

use super::fan_out::each_store;
use crate::{check_range, check_run, Caps, PageStore, ReadOp, StoreError, StoreInfo};
use crate::{StoreResult, WriteOp, PAGE_SIZE};
use std::sync::Arc;

/// Most stores one stripe spreads over.
pub const STORES_MAX: usize = 64;

pub struct Stripe {
    stores: Vec<Arc<dyn PageStore>>,
    chunk_pages: u64,
    pages: u64,
}

/// One chunk-bounded piece of a run: which store, where there, where in the
/// caller's buffer (pages from the run's start), and how many pages.
#[derive(Clone, Copy)]
struct Piece {
    store: usize,
    local_page: u64,
    offset_pages: u64,
    count: u64,
}

impl Stripe {
    /// Stripe over `stores` in chunks of `chunk_pages`. Each store must hold
    /// the same whole number of chunks; the stripe is their sum.
    pub fn new(stores: Vec<Arc<dyn PageStore>>, chunk_pages: u64) -> StoreResult<Self> {
        let bad = |why: String| Err(StoreError::Unavailable(format!("stripe: {why}")));
        if stores.is_empty() || stores.len() > STORES_MAX || chunk_pages == 0 {
            return bad(format!("needs 1..={STORES_MAX} stores and chunk_pages > 0"));
        }
        let each = stores[0].info().pages;
        if stores.iter().any(|s| s.info().pages != each) || !each.is_multiple_of(chunk_pages) {
            return bad(format!("every store must hold the same multiple of {chunk_pages} pages"));
        }
        let pages = each * stores.len() as u64;
        Ok(Stripe { stores, chunk_pages, pages })
    }

    /// The pieces of the run `page..page + count`, in order.
    fn pieces(&self, page: u64, count: u64) -> impl Iterator<Item = Piece> + '_ {
        let n = self.stores.len() as u64;
        let mut at = page;
        std::iter::from_fn(move || {
            if at >= page + count {
                return None;
            }
            let chunk = at / self.chunk_pages;
            let within = at % self.chunk_pages;
            let len = (self.chunk_pages - within).min(page + count - at);
            let piece = Piece {
                store: (chunk % n) as usize,
                local_page: (chunk / n) * self.chunk_pages + within,
                offset_pages: at - page,
                count: len,
            };
            at += len;
            Some(piece)
        })
    }
}

impl PageStore for Stripe {
    fn info(&self) -> StoreInfo {
        let infos: Vec<StoreInfo> = self.stores.iter().map(|s| s.info()).collect();
        let caps = Caps {
            durable: infos.iter().all(|i| i.caps.durable),
            discard_frees: infos.iter().all(|i| i.caps.discard_frees),
            fast: infos.iter().all(|i| i.caps.fast),
            checked: infos.iter().all(|i| i.caps.checked),
        };
        let names: Vec<String> = infos.into_iter().map(|i| i.name).collect();
        StoreInfo { pages: self.pages, caps, name: format!("stripe({})", names.join(",")) }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        for op in ops.iter() {
            check_run(self.pages, op.page, op.buf.len())?;
        }
        let mut batches: Vec<Vec<ReadOp>> = (0..self.stores.len()).map(|_| Vec::new()).collect();
        for op in ops.iter_mut() {
            let mut rest: &mut [u8] = op.buf;
            for p in self.pieces(op.page, (rest.len() / PAGE_SIZE) as u64) {
                let (buf, tail) = rest.split_at_mut(p.count as usize * PAGE_SIZE);
                rest = tail;
                batches[p.store].push(ReadOp { page: p.local_page, buf });
            }
        }
        each_store(&self.stores, batches, |s, b| s.read(b))
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        for op in ops {
            check_run(self.pages, op.page, op.data.len())?;
        }
        let mut batches: Vec<Vec<WriteOp>> = (0..self.stores.len()).map(|_| Vec::new()).collect();
        for op in ops {
            for p in self.pieces(op.page, (op.data.len() / PAGE_SIZE) as u64) {
                let at = p.offset_pages as usize * PAGE_SIZE;
                let data = &op.data[at..at + p.count as usize * PAGE_SIZE];
                batches[p.store].push(WriteOp { page: p.local_page, data });
            }
        }
        each_store(&self.stores, batches, |s, b| s.write(b))
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        check_range(self.pages, page, count)?;
        let mut batches: Vec<Vec<(u64, u64)>> =
            (0..self.stores.len()).map(|_| Vec::new()).collect();
        for p in self.pieces(page, count) {
            batches[p.store].push((p.local_page, p.count));
        }
        each_store(&self.stores, batches, |s, b| b.iter().try_for_each(|&(pg, n)| s.discard(pg, n)))
    }

    fn flush(&self) -> StoreResult<()> {
        let batches = self.stores.iter().map(|_| vec![()]).collect();
        each_store(&self.stores, batches, |s, _| s.flush())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::Stats;
    use crate::ram::{RamOptions, RamStore};
    use proptest::prelude::*;

    fn stripe(n: usize, each: u64, chunk: u64) -> (Stripe, Vec<Arc<Stats<RamStore>>>) {
        let parts: Vec<Arc<Stats<RamStore>>> = (0..n)
            .map(|_| Arc::new(Stats::new(RamStore::new(each, RamOptions::default()).unwrap())))
            .collect();
        let stores = parts.iter().map(|p| Arc::clone(p) as Arc<dyn PageStore>).collect();
        (Stripe::new(stores, chunk).unwrap(), parts)
    }

    fn page(seed: u8, p: u64) -> Vec<u8> {
        (0..PAGE_SIZE).map(|i| (i as u64 ^ p.wrapping_mul(131) ^ seed as u64) as u8).collect()
    }

    #[test]
    fn pages_spread_over_every_store_and_read_back() {
        let (s, parts) = stripe(3, 64, 4);
        assert_eq!(s.info().pages, 192);
        let data: Vec<u8> = (0..192).flat_map(|p| page(1, p)).collect();
        s.write(&[WriteOp { page: 0, data: &data }]).unwrap();
        for p in &parts {
            assert_eq!(p.snapshot().write.pages, 64, "each store holds a third");
        }
        let mut back = vec![0u8; data.len()];
        s.read(&mut [ReadOp { page: 0, buf: &mut back }]).unwrap();
        assert!(back == data);
        // Page 5 is chunk 1, so store 1, local page 1.
        let mut one = vec![0u8; PAGE_SIZE];
        parts[1].read(&mut [ReadOp { page: 1, buf: &mut one }]).unwrap();
        assert!(one == page(1, 5));
    }

    #[test]
    fn bad_shapes_are_refused() {
        let r = |pages| {
            Arc::new(RamStore::new(pages, RamOptions::default()).unwrap()) as Arc<dyn PageStore>
        };
        assert!(Stripe::new(vec![], 4).is_err());
        assert!(Stripe::new(vec![r(8), r(12)], 4).is_err(), "unequal stores");
        assert!(Stripe::new(vec![r(10)], 4).is_err(), "not whole chunks");
        let (s, _) = stripe(2, 8, 4);
        let mut buf = vec![0u8; PAGE_SIZE];
        assert!(s.read(&mut [ReadOp { page: 16, buf: &mut buf }]).is_err());
        assert!(s.discard(15, 2).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn matches_a_model(ops in proptest::collection::vec((0u8..3, 0u64..90, 1u64..30, any::<u8>()), 1..25),
                           n in 1usize..4, chunk in 1u64..9) {
            let each = chunk * (120 / chunk / n as u64 + 1);
            let (s, _) = stripe(n, each, chunk);
            let pages = s.info().pages;
            let mut model = vec![vec![0u8; PAGE_SIZE]; pages as usize];
            for (kind, at, count, seed) in ops {
                let count = count.min(pages - at);
                match kind {
                    0 => {
                        let data: Vec<u8> = (at..at + count).flat_map(|p| page(seed, p)).collect();
                        s.write(&[WriteOp { page: at, data: &data }]).unwrap();
                        (at..at + count).for_each(|p| model[p as usize] = page(seed, p));
                    }
                    1 => {
                        s.discard(at, count).unwrap();
                        (at..at + count).for_each(|p| model[p as usize] = vec![0; PAGE_SIZE]);
                    }
                    _ => {
                        let mut buf = vec![0u8; count as usize * PAGE_SIZE];
                        s.read(&mut [ReadOp { page: at, buf: &mut buf }]).unwrap();
                        for (i, got) in buf.chunks(PAGE_SIZE).enumerate() {
                            prop_assert!(got == &model[at as usize + i][..]);
                        }
                    }
                }
            }
        }
    }
}
