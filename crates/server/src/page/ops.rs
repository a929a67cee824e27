//! Serving one decoded request: bounds, slab lookup, the store call, and the
//! reply appended to the connection's output buffer.

use super::registry::{BorrowerId, Registry, Slab};
use crate::out_buf::OutBuf;
use memlend_store::{
    PageStore, ReadOp, Sidecar, SidecarStore, StoreError, WriteOp, PAGE_SIZE, SIDECAR_LEN,
};
use memlend_wire::page::{self, Opcode, RepHeader, ReqHeader, StatReply, Status, REP_HEADER_LEN};
use std::sync::Arc;
use std::time::Duration;

pub struct Ctx<'a> {
    pub registry: &'a Registry,
    pub borrower: BorrowerId,
    pub batch_pages_max: u32,
}

/// What happened, for counters and the slab cache.
pub enum Outcome {
    Done { op: Opcode, pages: u64 },
    Closed(u32),
    Failed(Status),
}

pub fn store_status(e: &StoreError) -> Status {
    match e {
        StoreError::OutOfRange { .. } => Status::OutOfRange,
        StoreError::Misaligned { .. } => Status::BadLength,
        StoreError::Corrupt { .. } => Status::Corrupt,
        StoreError::NoSpace(_) => Status::NoSpace,
        StoreError::Unavailable(_) | StoreError::Io(_) => Status::IoError,
    }
}

/// Serve `h` and append exactly one reply to `out`.
pub fn serve_request(
    ctx: &Ctx,
    h: &ReqHeader,
    payload: &[u8],
    slab: Option<&Slab>,
    out: &mut OutBuf,
) -> Outcome {
    let result = dispatch(ctx, h, payload, slab, out);
    match result {
        Ok(outcome) => outcome,
        Err(status) => {
            out.extend(&RepHeader::status(status, h.tag, h.seq).encode());
            Outcome::Failed(status)
        }
    }
}

fn dispatch(
    ctx: &Ctx,
    h: &ReqHeader,
    payload: &[u8],
    slab: Option<&Slab>,
    out: &mut OutBuf,
) -> Result<Outcome, Status> {
    let op = h.validate(ctx.batch_pages_max).map_err(|e| e.status())?;
    if h.payload_len > 0 && page::payload_crc(payload) != h.payload_crc {
        return Err(Status::BadPayloadCrc);
    }
    let done = |pages: u64| Ok(Outcome::Done { op, pages });
    match op {
        Opcode::Ping => ok(out, h, 0).and(done(0)),
        Opcode::OpenSlab => {
            let id = ctx.registry.open(ctx.borrower, h.page, h.sealed())?;
            tracing::debug!(slab = id, pages = h.page, sealed = h.sealed(), "slab opened");
            ok(out, h, id as u64).and(done(0))
        }
        Opcode::CloseSlab => {
            ctx.registry.close(ctx.borrower, h.slab)?;
            ok(out, h, 0)?;
            Ok(Outcome::Closed(h.slab))
        }
        Opcode::Stat => stat(ctx, h, out).and(done(0)),
        Opcode::Linger => {
            let grace = Duration::from_secs(u64::from(h.count));
            ctx.registry.linger(ctx.borrower, grace);
            tracing::debug!(grace_s = h.count, "borrower set its linger");
            ok(out, h, 0).and(done(0))
        }
        _ => {
            let slab = slab.ok_or(Status::NoSuchSlab)?;
            data_op(op, h, payload, slab, out)?;
            done(h.count as u64)
        }
    }
}

fn data_op(
    op: Opcode,
    h: &ReqHeader,
    payload: &[u8],
    slab: &Slab,
    out: &mut OutBuf,
) -> Result<(), Status> {
    let st = |e: StoreError| store_status(&e);
    if h.sealed() {
        let side = slab.sealed.as_ref().ok_or(Status::BadFlags)?;
        return sealed_op(op, h, payload, side, out);
    }
    let store = &slab.store;
    match op {
        Opcode::Read => read_reply(out, h, |buf| store.read(&mut [ReadOp { page: h.page, buf }])),
        Opcode::ReadV => {
            let pages = indices(payload, h.count);
            read_reply(out, h, |buf| {
                let mut ops: Vec<ReadOp> = buf
                    .chunks_exact_mut(PAGE_SIZE)
                    .zip(pages)
                    .map(|(buf, page)| ReadOp { page, buf })
                    .collect();
                store.read(&mut ops)
            })
        }
        Opcode::Write => {
            store.write(&[WriteOp { page: h.page, data: payload }]).map_err(st)?;
            ok(out, h, 0)
        }
        Opcode::WriteV => {
            let (idx, data) = payload.split_at(h.count as usize * 8);
            let ops: Vec<WriteOp> = data
                .chunks_exact(PAGE_SIZE)
                .zip(indices(idx, h.count))
                .map(|(data, page)| WriteOp { page, data })
                .collect();
            store.write(&ops).map_err(st)?;
            ok(out, h, 0)
        }
        Opcode::Discard => {
            store.discard(h.page, h.count as u64).map_err(st)?;
            ok(out, h, 0)
        }
        Opcode::Flush => {
            store.flush().map_err(st)?;
            ok(out, h, 0)
        }
        Opcode::SlabInfo => ok(out, h, slab.pages),
        Opcode::Ping | Opcode::OpenSlab | Opcode::CloseSlab | Opcode::Stat | Opcode::Linger => {
            unreachable!("served by dispatch")
        }
    }
}

/// READ or WRITE with sidecars (validated: no other opcode is sealed).
fn sealed_op(
    op: Opcode,
    h: &ReqHeader,
    payload: &[u8],
    side: &Arc<dyn SidecarStore>,
    out: &mut OutBuf,
) -> Result<(), Status> {
    let count = h.count as usize;
    match op {
        Opcode::Read if sealed_read_in_place(out, h, side)? => Ok(()),
        Opcode::Read => sealed_read_reply(out, h, |tags, data| {
            let tags: &mut [Sidecar] = tags.as_chunks_mut().0;
            side.read_with(&mut [ReadOp { page: h.page, buf: data }], tags)
        }),
        Opcode::Write => {
            let (tags, data) = payload.split_at(count * SIDECAR_LEN);
            let tags: &[Sidecar] = tags.as_chunks().0;
            side.write_with(&[WriteOp { page: h.page, data }], tags)
                .map_err(|e| store_status(&e))?;
            ok(out, h, 0)
        }
        _ => unreachable!("validate lets only READ and WRITE be sealed here"),
    }
}

/// A sealed READ whose pages the store lends in place: the header and the
/// sidecars go in the buffer, the pages straight from the slab (see
/// `out_buf.rs`), saving the donor a copy of every page it sends. False if
/// the store cannot lend them; nothing is added then.
fn sealed_read_in_place(
    out: &mut OutBuf,
    h: &ReqHeader,
    side: &Arc<dyn SidecarStore>,
) -> Result<bool, Status> {
    let tags_len = h.count as usize * SIDECAR_LEN;
    let at = out.len();
    let (head, tags) = out.reserve(REP_HEADER_LEN + tags_len).split_at_mut(REP_HEADER_LEN);
    let mem = match side.read_tags_in_place(h.page, tags.as_chunks_mut().0) {
        Some(Ok(mem)) => mem,
        Some(Err(e)) => {
            out.truncate(at);
            return Err(store_status(&e));
        }
        None => {
            out.truncate(at);
            return Ok(false);
        }
    };
    debug_assert_eq!(mem.len, h.count as usize * PAGE_SIZE);
    let reply = RepHeader {
        payload_len: (tags_len + mem.len) as u32,
        payload_crc: page::payload_crc(tags),
        ..RepHeader::status(Status::Ok, h.tag, h.seq)
    };
    head.copy_from_slice(&reply.encode());
    out.push_in_place(mem, Arc::clone(side) as Arc<dyn PageStore>);
    Ok(true)
}

/// The page indices of a READV/WRITEV payload (validated to hold `count`).
fn indices(b: &[u8], count: u32) -> impl Iterator<Item = u64> + '_ {
    b.chunks_exact(8).take(count as usize).map(|c| u64::from_le_bytes(c.try_into().unwrap()))
}

fn ok(out: &mut OutBuf, h: &ReqHeader, value: u64) -> Result<(), Status> {
    let reply = RepHeader { value, ..RepHeader::status(Status::Ok, h.tag, h.seq) };
    out.extend(&reply.encode());
    Ok(())
}

/// Append a reply header and `count` pages filled by `fill` straight into the
/// output buffer (one copy, store to socket buffer); on failure nothing of it
/// stays in `out`.
fn read_reply(
    out: &mut OutBuf,
    h: &ReqHeader,
    fill: impl FnOnce(&mut [u8]) -> Result<(), StoreError>,
) -> Result<(), Status> {
    let len_bytes = h.count as usize * PAGE_SIZE;
    reply_with(out, h, len_bytes, len_bytes, fill)
}

/// `read_reply` for a sealed READ: the sidecars, then the pages.
fn sealed_read_reply(
    out: &mut OutBuf,
    h: &ReqHeader,
    fill: impl FnOnce(&mut [u8], &mut [u8]) -> Result<(), StoreError>,
) -> Result<(), Status> {
    let tags_len = h.count as usize * SIDECAR_LEN;
    let len_bytes = tags_len + h.count as usize * PAGE_SIZE;
    // The CRC covers the sidecars only: the borrower checks each page
    // against its AEAD tag, so a CRC of the pages would check them twice.
    reply_with(out, h, len_bytes, tags_len, |b| {
        let (tags, data) = b.split_at_mut(tags_len);
        fill(tags, data)
    })
}

/// A reply of `len_bytes` filled by `fill`; its CRC covers the first
/// `crc_len` bytes.
fn reply_with(
    out: &mut OutBuf,
    h: &ReqHeader,
    len_bytes: usize,
    crc_len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), StoreError>,
) -> Result<(), Status> {
    let at = out.len();
    let (head, data) = out.reserve(REP_HEADER_LEN + len_bytes).split_at_mut(REP_HEADER_LEN);
    if let Err(e) = fill(data) {
        out.truncate(at);
        return Err(store_status(&e));
    }
    let reply = RepHeader {
        payload_len: len_bytes as u32,
        payload_crc: page::payload_crc(&data[..crc_len]),
        ..RepHeader::status(Status::Ok, h.tag, h.seq)
    };
    head.copy_from_slice(&reply.encode());
    Ok(())
}

fn stat(ctx: &Ctx, h: &ReqHeader, out: &mut OutBuf) -> Result<(), Status> {
    let u = ctx.registry.usage(ctx.borrower);
    let body = StatReply {
        lend_pages: u.lend_pages,
        free_pages: u.free_pages,
        borrower_slabs: u.borrower_slabs,
        borrower_pages: u.borrower_pages,
    }
    .encode();
    let reply = RepHeader {
        payload_len: body.len() as u32,
        payload_crc: page::payload_crc(&body),
        ..RepHeader::status(Status::Ok, h.tag, h.seq)
    };
    out.extend(&reply.encode());
    out.extend(&body);
    Ok(())
}
