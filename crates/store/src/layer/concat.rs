//! `concat`: one store made of several of any sizes, end to end. Far memory
//! from a cluster comes as leases of whatever size each donor could grant;
//! this joins them into one page space. A batch is split by member, and
//! members run at once (see `fan_out`).

use super::fan_out::each_store;
use crate::{check_range, check_run, Caps, PageStore, ReadOp, StoreError, StoreInfo};
use crate::{StoreResult, WriteOp, PAGE_SIZE};
use std::sync::Arc;

/// Most members of one concat.
pub const MEMBERS_MAX: usize = 256;

pub struct Concat {
    stores: Vec<Arc<dyn PageStore>>,
    /// `starts[i]` is member i's first page; `starts[n]` is the total.
    starts: Vec<u64>,
}

impl Concat {
    pub fn new(stores: Vec<Arc<dyn PageStore>>) -> StoreResult<Self> {
        if stores.is_empty() || stores.len() > MEMBERS_MAX {
            return Err(StoreError::Unavailable(format!("concat: needs 1..={MEMBERS_MAX} stores")));
        }
        let mut starts = vec![0u64];
        for s in &stores {
            let pages = s.info().pages;
            if pages == 0 {
                return Err(StoreError::Unavailable("concat: an empty member".into()));
            }
            starts.push(starts.last().expect("non-empty") + pages);
        }
        Ok(Concat { stores, starts })
    }

    pub fn members(&self) -> &[Arc<dyn PageStore>] {
        &self.stores
    }

    fn pages(&self) -> u64 {
        *self.starts.last().expect("non-empty")
    }

    /// `(member, local page, pages from the run's start, count)` for each
    /// member-bounded piece of `page..page + count`.
    fn pieces(&self, page: u64, count: u64) -> impl Iterator<Item = (usize, u64, u64, u64)> + '_ {
        let mut at = page;
        let mut m = self.starts.partition_point(|&s| s <= page).saturating_sub(1);
        std::iter::from_fn(move || {
            if at >= page + count {
                return None;
            }
            let len = (self.starts[m + 1] - at).min(page + count - at);
            let piece = (m, at - self.starts[m], at - page, len);
            at += len;
            m += 1;
            Some(piece)
        })
    }

    fn empty<T>(&self) -> Vec<Vec<T>> {
        (0..self.stores.len()).map(|_| Vec::new()).collect()
    }
}

impl PageStore for Concat {
    fn info(&self) -> StoreInfo {
        let infos: Vec<StoreInfo> = self.stores.iter().map(|s| s.info()).collect();
        let caps = Caps {
            durable: infos.iter().all(|i| i.caps.durable),
            discard_frees: infos.iter().all(|i| i.caps.discard_frees),
            fast: infos.iter().all(|i| i.caps.fast),
            checked: infos.iter().all(|i| i.caps.checked),
        };
        let names: Vec<String> = infos.into_iter().map(|i| i.name).collect();
        StoreInfo { pages: self.pages(), caps, name: format!("concat({})", names.join(",")) }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        for op in ops.iter() {
            check_run(self.pages(), op.page, op.buf.len())?;
        }
        let mut batches: Vec<Vec<ReadOp>> = self.empty();
        for op in ops.iter_mut() {
            let mut rest: &mut [u8] = op.buf;
            for (m, local, _, count) in self.pieces(op.page, (rest.len() / PAGE_SIZE) as u64) {
                let (buf, tail) = rest.split_at_mut(count as usize * PAGE_SIZE);
                rest = tail;
                batches[m].push(ReadOp { page: local, buf });
            }
        }
        each_store(&self.stores, batches, |s, b| s.read(b))
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        for op in ops {
            check_run(self.pages(), op.page, op.data.len())?;
        }
        let mut batches: Vec<Vec<WriteOp>> = self.empty();
        for op in ops {
            for (m, local, offset, count) in
                self.pieces(op.page, (op.data.len() / PAGE_SIZE) as u64)
            {
                let at = offset as usize * PAGE_SIZE;
                batches[m].push(WriteOp {
                    page: local,
                    data: &op.data[at..at + count as usize * PAGE_SIZE],
                });
            }
        }
        each_store(&self.stores, batches, |s, b| s.write(b))
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        check_range(self.pages(), page, count)?;
        let mut batches: Vec<Vec<(u64, u64)>> = self.empty();
        for (m, local, _, n) in self.pieces(page, count) {
            batches[m].push((local, n));
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
    use crate::ram::{RamOptions, RamStore};
    use proptest::prelude::*;

    fn concat(sizes: &[u64]) -> (Concat, Vec<Arc<dyn PageStore>>) {
        let parts: Vec<Arc<dyn PageStore>> = sizes
            .iter()
            .map(|&p| {
                Arc::new(RamStore::new(p, RamOptions::default()).unwrap()) as Arc<dyn PageStore>
            })
            .collect();
        (Concat::new(parts.clone()).unwrap(), parts)
    }

    fn page(p: u64) -> Vec<u8> {
        (0..PAGE_SIZE).map(|i| (i as u64 ^ p.wrapping_mul(131)) as u8).collect()
    }

    #[test]
    fn members_end_to_end_read_back_and_hold_their_part() {
        let (c, parts) = concat(&[3, 5, 1]);
        assert_eq!(c.info().pages, 9);
        let data: Vec<u8> = (0..9).flat_map(page).collect();
        c.write(&[WriteOp { page: 0, data: &data }]).unwrap();
        let mut back = vec![0u8; data.len()];
        c.read(&mut [ReadOp { page: 0, buf: &mut back }]).unwrap();
        assert!(back == data);
        let mut one = vec![0u8; PAGE_SIZE];
        parts[1].read(&mut [ReadOp { page: 4, buf: &mut one }]).unwrap();
        assert!(one == page(7), "page 7 is member 1's page 4");
        c.discard(2, 2).unwrap();
        c.read(&mut [ReadOp { page: 0, buf: &mut back }]).unwrap();
        assert!(back[2 * PAGE_SIZE..4 * PAGE_SIZE].iter().all(|&b| b == 0));
        assert!(back[4 * PAGE_SIZE..] == data[4 * PAGE_SIZE..]);
        assert!(c.read(&mut [ReadOp { page: 8, buf: &mut vec![0u8; 2 * PAGE_SIZE] }]).is_err());
        assert!(Concat::new(Vec::new()).is_err());
    }

    proptest! {
        #[test]
        fn any_run_matches_a_flat_model(sizes in proptest::collection::vec(1u64..6, 1..5), a in 0u64..1000, b in 0u64..1000) {
            let (c, _) = concat(&sizes);
            let total: u64 = sizes.iter().sum();
            let start = a % total;
            let len = 1 + b % (total - start);
            let data: Vec<u8> = (start..start + len).flat_map(page).collect();
            c.write(&[WriteOp { page: start, data: &data }]).unwrap();
            let mut back = vec![0u8; total as usize * PAGE_SIZE];
            c.read(&mut [ReadOp { page: 0, buf: &mut back }]).unwrap();
            let s = start as usize * PAGE_SIZE;
            prop_assert!(back[s..s + data.len()] == data[..]);
            prop_assert!(back[..s].iter().all(|&b| b == 0));
        }
    }
}
