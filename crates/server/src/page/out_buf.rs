//! The reply buffer of one connection: fixed capacity, allocated and zeroed
//! once. Read replies are filled in place, so a page costs one copy (store to
//! buffer) and no zeroing, which a growing `Vec` would need for every reply.

use memlend_wire::page::{limits, REP_HEADER_LEN};

/// Replies are sent once the buffer holds this much.
pub const FLUSH_BYTES: usize = 256 << 10;
/// Room for a full flush batch plus one largest reply.
const CAPACITY_BYTES: usize =
    FLUSH_BYTES + REP_HEADER_LEN + limits::MAX_REPLY_PAYLOAD_BYTES as usize + 4096;

pub struct OutBuf {
    buf: Box<[u8]>,
    len: usize,
}

impl OutBuf {
    pub fn new() -> Self {
        OutBuf { buf: vec![0; CAPACITY_BYTES].into_boxed_slice(), len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn truncate(&mut self, len: usize) {
        assert!(len <= self.len);
        self.len = len;
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.grow(bytes.len()).copy_from_slice(bytes);
    }

    /// Append `n` bytes (old contents, not zeroes) for the caller to fill.
    /// The caller flushes before `len` passes `FLUSH_BYTES`, so one reply
    /// always fits: running out of room is a bug, not an input error.
    pub fn grow(&mut self, n: usize) -> &mut [u8] {
        let at = self.len;
        assert!(at + n <= self.buf.len(), "reply buffer overrun: flush before FLUSH_BYTES");
        self.len += n;
        &mut self.buf[at..at + n]
    }
}
