//! `NBD_CMD_BLOCK_STATUS` for `base:allocation`: which bytes of the export
//! hold data and which are holes that read as zero, from what the page
//! store knows of its own pages (`PageStore::allocation`). A store that
//! does not know reports everything as data, which is always true.
//!
//! A reply may describe less than was asked, as the protocol allows: the
//! client asks again from where it ended. That bounds the work and the
//! reply of one request whatever its length.

use super::errno::nbd_errno;
use super::export::ExportState;
use super::meta_context::BASE_ALLOCATION_ID;
use super::session::Session;
use crate::out_buf::OutBuf;
use memlend_store::{StoreResult, PAGE_SIZE};
use memlend_wire::nbd::{encode_block_status_chunk, state, Extent};

const PS: u64 = PAGE_SIZE as u64;
/// Most extents in one reply (32 KiB of descriptors).
pub(crate) const EXTENTS_PER_REPLY_MAX: usize = 4096;
/// Most pages asked of the store for one request (128 MiB): bounds its work
/// and the runs it returns.
const PAGES_PER_REQUEST_MAX: u64 = 32 << 10;
const HOLE_FLAGS: u32 = state::HOLE | state::ZERO;
const DATA_FLAGS: u32 = 0;

impl ExportState {
    /// Extents from `offset` covering at most `len` bytes, at most
    /// `extents_max` of them. Callers have checked the range.
    pub fn extents(&self, offset: u64, len: u32, extents_max: usize) -> StoreResult<Vec<Extent>> {
        let first_page = offset / PS;
        let end_page = (offset + len as u64).div_ceil(PS);
        let count = (end_page - first_page).min(PAGES_PER_REQUEST_MAX);
        let mut runs = Vec::new();
        if let Some(known) = self.store.allocation(first_page, count, &mut runs) {
            known?;
            let extents = to_extents(offset, len, &runs, extents_max);
            if !extents.is_empty() {
                return Ok(extents);
            }
            // A store that returned no runs at all breaks its contract;
            // "all data" below is still a true answer.
            tracing::warn!(export = %self.name, offset, len, "store reported no allocation runs");
        }
        Ok(vec![Extent { len_bytes: len, flags: DATA_FLAGS }])
    }
}

/// Byte extents for page runs that start at the page holding `offset`:
/// the first begins at `offset`, the last ends by `offset + len`, alike
/// neighbours are merged, and there are at most `extents_max`.
fn to_extents(offset: u64, len: u32, runs: &[(u64, bool)], extents_max: usize) -> Vec<Extent> {
    let end = offset + len as u64;
    let mut extents: Vec<Extent> = Vec::new();
    let mut run_start = offset - offset % PS;
    for &(pages, allocated) in runs {
        let run_end = run_start.saturating_add(pages.saturating_mul(PS));
        let (from, to) = (run_start.max(offset), run_end.min(end));
        run_start = run_end;
        if from >= to {
            continue;
        }
        // Within `len`, so it fits the 32-bit length, and so does a sum.
        let len_bytes = (to - from) as u32;
        let flags = if allocated { DATA_FLAGS } else { HOLE_FLAGS };
        let full = extents.len() == extents_max;
        match extents.last_mut() {
            Some(last) if last.flags == flags => last.len_bytes += len_bytes,
            _ if full => break,
            _ => extents.push(Extent { len_bytes, flags }),
        }
        if to == end {
            break;
        }
    }
    extents
}

impl Session {
    /// Answer BLOCK_STATUS with one BLOCK_STATUS chunk flagged DONE (or an
    /// error); with REQ_ONE it holds a single extent.
    pub(crate) fn block_status(
        &self,
        cookie: u64,
        offset: u64,
        len: u32,
        req_one: bool,
        out: &mut OutBuf,
    ) {
        let extents_max = if req_one { 1 } else { EXTENTS_PER_REPLY_MAX };
        match self.export.extents(offset, len, extents_max) {
            Ok(extents) => {
                let mut chunk = Vec::new();
                encode_block_status_chunk(&mut chunk, cookie, BASE_ALLOCATION_ID, &extents, true);
                out.extend(&chunk);
            }
            Err(err) => {
                let errno = nbd_errno(&err);
                tracing::warn!(peer = %self.peer, export = %self.export.name, error = %err, ?errno,
                    "nbd block status failed");
                self.reply_error(out, cookie, errno, &format!("block status: {err}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbd::export::Export;
    use memlend_store::ram::{RamOptions, RamStore};
    use memlend_store::WriteOp;
    use std::sync::Arc;

    const H: u32 = HOLE_FLAGS;

    fn e(len_bytes: u32, flags: u32) -> Extent {
        Extent { len_bytes, flags }
    }

    #[test]
    fn extents_start_at_the_offset_and_end_by_the_length() {
        let runs = [(2, false), (1, true), (5, false)];
        assert_eq!(to_extents(0, 8 * 4096, &runs, 100), [e(8192, H), e(4096, 0), e(20480, H)]);
        // Mid-page start and end, inside the first and last runs.
        assert_eq!(to_extents(100, 3 * 4096, &runs, 100), [e(8092, H), e(4096, 0), e(100, H)]);
        // Starting in the data page: the runs start at the page of the offset.
        assert_eq!(to_extents(8192 + 10, 10, &runs[1..], 100), [e(10, 0)]);
        assert_eq!(to_extents(8192 + 10, 5000, &runs[1..], 100), [e(4086, 0), e(914, H)]);
    }

    #[test]
    fn extents_are_merged_and_capped() {
        let runs = [(1, true), (1, true), (1, false), (1, true), (1, false)];
        assert_eq!(
            to_extents(0, 5 * 4096, &runs, 100),
            [e(8192, 0), e(4096, H), e(4096, 0), e(4096, H)]
        );
        assert_eq!(to_extents(0, 5 * 4096, &runs, 2), [e(8192, 0), e(4096, H)]);
        assert_eq!(to_extents(0, 5 * 4096, &runs, 1), [e(8192, 0)]);
        // Runs that stop short give a reply that covers less.
        assert_eq!(to_extents(0, 5 * 4096, &runs[..1], 100), [e(4096, 0)]);
        assert_eq!(to_extents(0, 4096, &[], 100), []);
    }

    fn export(pages: u64) -> ExportState {
        let store = Arc::new(RamStore::new(pages, RamOptions::default()).unwrap());
        ExportState::new(Export::new("t", store)).unwrap()
    }

    #[test]
    fn a_ram_export_reports_written_pages_as_data() {
        let x = export(64);
        x.store.write(&[WriteOp { page: 4, data: &[7u8; 2 * PAGE_SIZE] }]).unwrap();
        let all = x.extents(0, 64 * 4096, 100).unwrap();
        assert_eq!(all, [e(4 * 4096, H), e(2 * 4096, 0), e(58 * 4096, H)]);
        assert_eq!(x.extents(5 * 4096, 3 * 4096, 1).unwrap(), [e(4096, 0)]);
    }

    #[test]
    fn a_long_request_is_answered_for_a_bounded_part() {
        let pages = PAGES_PER_REQUEST_MAX * 2;
        let x = export(pages);
        let len = u32::try_from(pages * PS).unwrap();
        let got = x.extents(0, len, 100).unwrap();
        assert_eq!(got, [e((PAGES_PER_REQUEST_MAX * PS) as u32, H)]);
    }
}
