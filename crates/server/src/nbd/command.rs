//! Running a validated request against the export and encoding its reply.
//! Shared by the inline path and the worker pool.

use super::errno::nbd_errno;
use super::session::{Op, Session};
use crate::out_buf::OutBuf;
use memlend_store::{StoreError, StoreResult};
use memlend_wire::nbd::{encode_error_chunk, encode_none_chunk, encode_offset_data_header};
use memlend_wire::nbd::{Errno, SimpleReply, OFFSET_DATA_HEADER_LEN, SIMPLE_REPLY_LEN};

impl Session {
    /// Run `op` (never `Op::Disc`) and append its reply to `out`.
    pub fn execute(&self, cookie: u64, op: Op, payload: &[u8], out: &mut OutBuf) {
        let e = &self.export;
        let (what, result) = match op {
            Op::Read { offset, len, .. } => return self.read(cookie, offset, len, out),
            Op::BlockStatus { offset, len, req_one } => {
                return self.block_status(cookie, offset, len, req_one, out)
            }
            Op::Write { offset, fua } => {
                ("write", e.write_at(offset, payload).and_then(|_| self.fua(fua)))
            }
            Op::Trim { offset, len, fua } => {
                ("trim", e.trim_at(offset, len as u64).and_then(|_| self.fua(fua)))
            }
            Op::Zero { offset, len, may_trim, fua } => (
                "write zeroes",
                e.zero_at(offset, len as u64, may_trim).and_then(|_| self.fua(fua)),
            ),
            Op::Flush => ("flush", e.store.flush()),
            Op::Cache | Op::Disc => ("cache", Ok(())),
        };
        match result {
            Ok(()) => out.extend(&SimpleReply { error: 0, cookie }.encode()),
            Err(err) => self.store_failed(out, cookie, what, &err),
        }
    }

    fn fua(&self, fua: bool) -> StoreResult<()> {
        if fua {
            self.export.store.flush()
        } else {
            Ok(())
        }
    }

    /// Read straight into the reply batch: reserve the header, fill the data,
    /// then write the header (or undo it all and send an error).
    fn read(&self, cookie: u64, offset: u64, len: u32, out: &mut OutBuf) {
        if self.structured && len == 0 {
            return out.extend(&encode_none_chunk(cookie));
        }
        let header_bytes = if self.structured { OFFSET_DATA_HEADER_LEN } else { SIMPLE_REPLY_LEN };
        let at = out.len();
        let data = &mut out.reserve(header_bytes + len as usize)[header_bytes..];
        if let Err(err) = self.export.read_at(offset, data) {
            out.truncate(at);
            return self.store_failed(out, cookie, "read", &err);
        }
        let header = out.range_mut(at, header_bytes);
        if self.structured {
            header.copy_from_slice(&encode_offset_data_header(cookie, offset, len, true));
        } else {
            header.copy_from_slice(&SimpleReply { error: 0, cookie }.encode());
        }
    }

    fn store_failed(&self, out: &mut OutBuf, cookie: u64, what: &str, err: &StoreError) {
        let errno = nbd_errno(err);
        tracing::warn!(peer = %self.peer, export = %self.export.name, op = what, error = %err, ?errno,
            "nbd store operation failed");
        self.reply_error(out, cookie, errno, &format!("{what}: {err}"));
    }

    /// Append an error reply: a structured ERROR chunk with a message when
    /// structured replies were negotiated (required for READ), else simple.
    pub fn reply_error(&self, out: &mut OutBuf, cookie: u64, errno: Errno, why: &str) {
        if self.structured {
            let mut chunk = Vec::with_capacity(64 + why.len());
            encode_error_chunk(&mut chunk, cookie, errno as u32, why.as_bytes(), true);
            out.extend(&chunk);
        } else {
            out.extend(&SimpleReply { error: errno as u32, cookie }.encode());
        }
    }
}
