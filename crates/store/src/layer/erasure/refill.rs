//! Filling a spare (see `rebuild.rs`): a run of stripes at a time, and a
//! stripe at a time where a run cannot vouch for its sources.

use super::{Coded, FAILED};
use crate::page_locks::LockSet;
use crate::{ReadOp, StoreError, StoreResult, WriteOp, PAGE_SIZE};
use std::sync::atomic::Ordering::Relaxed;

/// One source leg's pages of the run: leg page `first + i` at `i`.
struct Source {
    leg: usize,
    bytes: Vec<u8>,
}

/// Write slot `slot`'s shard of every stripe of `first..first + n` that
/// holds anything; how many were written. One read of the run from each of
/// k readable legs, one write to the spare, under the run's locks. Stripes
/// the batch cannot vouch for (a data page failing its sum, a source that
/// answered with an error) go one by one through `fill_stripe`, after the
/// locks are let go, which reads, checks and decodes per shard.
pub(super) fn fill_run(c: &Coded, slot: usize, first: u64, n: u64) -> StoreResult<u64> {
    let mut alone = Vec::new();
    let filled = {
        let _owned = c.locks.write(&LockSet::of_run(first, n));
        let live: Vec<u64> = (first..first + n).filter(|&s| stripe_written(c, s)).collect();
        if live.is_empty() {
            return Ok(0);
        }
        match read_sources(c, slot, first, n) {
            Some(sources) => write_shards(c, slot, first, &live, &sources, &mut alone)?,
            None => {
                alone = live;
                0
            }
        }
    };
    let mut one_by_one = 0;
    for stripe in alone {
        if c.legs[slot].state.load(Relaxed) == FAILED {
            return Err(StoreError::Unavailable("the spare failed while filling".into()));
        }
        one_by_one += u64::from(fill_stripe(c, slot, stripe)?);
    }
    Ok(filled + one_by_one)
}

fn stripe_written(c: &Coded, stripe: u64) -> bool {
    let k = c.k as u64;
    (stripe * k..((stripe + 1) * k).min(c.pages)).any(|p| c.written.get(p))
}

/// The run from k readable legs other than `slot`, data legs first; None
/// if fewer than k answered in full. A leg whose read fails is dropped as
/// usual (`leg_failed`); one that found bad pages (an authenticating leg)
/// is kept, but the run goes stripe by stripe, where each shard is checked.
fn read_sources(c: &Coded, slot: usize, first: u64, n: u64) -> Option<Vec<Source>> {
    let mut sources = Vec::with_capacity(c.k);
    for leg in (0..c.k + c.m).filter(|&l| l != slot) {
        if sources.len() == c.k {
            break;
        }
        if !c.legs[leg].readable() {
            continue;
        }
        let mut bytes = vec![0u8; n as usize * PAGE_SIZE];
        let store = c.legs[leg].store();
        match store.read(&mut [ReadOp { page: first, buf: &mut bytes }]) {
            Ok(()) => sources.push(Source { leg, bytes }),
            Err(StoreError::Corrupt { .. }) => return None,
            Err(e) => {
                c.leg_failed(leg, &store, &e, "read");
            }
        }
    }
    (sources.len() == c.k).then_some(sources)
}

/// Compute and write the slot's shard of each stripe of `live`; stripes
/// whose data fails a sum go to `alone`. Returns the shards written.
fn write_shards(
    c: &Coded,
    slot: usize,
    first: u64,
    live: &[u64],
    sources: &[Source],
    alone: &mut Vec<u64>,
) -> StoreResult<u64> {
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    for &stripe in live {
        let shard = match shard_of(c, slot, stripe, (stripe - first) as usize, sources) {
            Ok(Some(shard)) => shard,
            Ok(None) => continue,
            Err(()) => {
                alone.push(stripe);
                continue;
            }
        };
        match runs.last_mut() {
            Some((at, buf)) if *at + (buf.len() / PAGE_SIZE) as u64 == stripe => {
                buf.extend_from_slice(&shard)
            }
            _ => runs.push((stripe, shard)),
        }
    }
    let ops: Vec<WriteOp<'_>> =
        runs.iter().map(|(page, data)| WriteOp { page: *page, data }).collect();
    if ops.is_empty() {
        return Ok(0);
    }
    let store = c.legs[slot].store();
    if let Err(e) = store.write(&ops) {
        c.leg_failed(slot, &store, &e, "rebuild");
        return Err(e);
    }
    Ok(runs.iter().map(|(_, buf)| (buf.len() / PAGE_SIZE) as u64).sum())
}

/// Slot `slot`'s shard of `stripe` (at offset `at` of the sources), None
/// if it holds nothing (a data page never written), Err if a data page
/// fails its sum or the decoder refuses.
fn shard_of(
    c: &Coded,
    slot: usize,
    stripe: u64,
    at: usize,
    sources: &[Source],
) -> Result<Option<Vec<u8>>, ()> {
    let k = c.k;
    let page_of = |j: usize| stripe * k as u64 + j as u64;
    if slot < k && (page_of(slot) >= c.pages || !c.written.get(page_of(slot))) {
        return Ok(None);
    }
    let zero = [0u8; PAGE_SIZE];
    let mut originals: Vec<(usize, &[u8])> = Vec::with_capacity(k);
    let mut recovery: Vec<(usize, &[u8])> = Vec::new();
    for s in sources {
        let bytes = &s.bytes[at * PAGE_SIZE..(at + 1) * PAGE_SIZE];
        if s.leg >= k {
            recovery.push((s.leg - k, bytes));
            continue;
        }
        let p = page_of(s.leg);
        // Pages never written are zero to the code, whatever the leg holds.
        if p >= c.pages || !c.written.get(p) {
            originals.push((s.leg, &zero));
        } else if c.sums.matches(p, bytes) {
            originals.push((s.leg, bytes));
        } else {
            c.counters.bad_copies.fetch_add(1, Relaxed);
            return Err(());
        }
    }
    let mut data: Vec<Option<Vec<u8>>> = vec![None; k];
    for &(j, bytes) in &originals {
        data[j] = Some(bytes.to_vec());
    }
    if originals.len() < k {
        let decoded = reed_solomon_simd::decode(k, c.m, originals, recovery).map_err(|_| ())?;
        for (j, bytes) in decoded {
            data[j] = Some(bytes);
        }
    }
    let data: Vec<Vec<u8>> = data.into_iter().collect::<Option<_>>().ok_or(())?;
    if slot < k {
        let shard = data.into_iter().nth(slot).expect("k data shards");
        return match c.sums.matches(page_of(slot), &shard) {
            true => Ok(Some(shard)),
            false => Err(()),
        };
    }
    let parity = reed_solomon_simd::encode(k, c.m, &data).map_err(|_| ())?;
    Ok(parity.into_iter().nth(slot - k))
}

/// Write the slot's shard of `stripe`, if the stripe holds anything, on
/// its own: the way for stripes a batch could not rebuild.
fn fill_stripe(c: &Coded, slot: usize, stripe: u64) -> StoreResult<bool> {
    let k = c.k as u64;
    let pages = stripe * k..((stripe + 1) * k).min(c.pages);
    if !pages.clone().any(|p| c.written.get(p)) {
        return Ok(false);
    }
    let _owned = c.locks.write(&c.stripe_lock(stripe));
    let shard = match slot < c.k {
        true => {
            let p = stripe * k + slot as u64;
            if p >= c.pages || !c.written.get(p) {
                return Ok(false);
            }
            c.decode(stripe, slot)?
        }
        false => {
            let mut data = Vec::with_capacity(c.k);
            for j in 0..c.k {
                let p = stripe * k + j as u64;
                data.push(match p < c.pages && c.written.get(p) {
                    true => c.current(stripe, j, p)?,
                    false => vec![0u8; PAGE_SIZE],
                });
            }
            let parity = reed_solomon_simd::encode(c.k, c.m, &data)
                .map_err(|e| StoreError::Unavailable(format!("erasure coding: {e}")))?;
            parity.into_iter().nth(slot - c.k).expect("m parity shards")
        }
    };
    let store = c.legs[slot].store();
    if let Err(e) = store.write(&[WriteOp { page: stripe, data: &shard }]) {
        c.leg_failed(slot, &store, &e, "rebuild");
        return Err(e);
    }
    Ok(true)
}
