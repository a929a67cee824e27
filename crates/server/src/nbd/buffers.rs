//! A connection's input and output buffers. Both are plain byte vectors that
//! are reused across requests, so the steady state allocates nothing.

use std::io::{self, Read};
use std::ops::Range;

/// Bytes read from the socket and not yet served. Grows to hold one whole
/// request (a WRITE with its payload) and shrinks back when drained.
pub(crate) struct InBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    base_bytes: usize,
    /// Bytes still to throw away (the payload of an oversize WRITE).
    skip_bytes: u64,
    /// Size of the frame being waited for (set by `make_room`), 0 if unknown.
    want_bytes: usize,
}

impl InBuf {
    pub fn new(base_bytes: usize) -> Self {
        InBuf {
            buf: vec![0; base_bytes],
            start: 0,
            end: 0,
            base_bytes,
            skip_bytes: 0,
            want_bytes: 0,
        }
    }

    /// Bytes received and not consumed.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Position of `pending()[0]` in the buffer, for `bytes`.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Bytes that were consumed earlier; valid until the next `read_from`.
    pub fn bytes(&self, r: Range<usize>) -> &[u8] {
        &self.buf[r]
    }

    pub fn consume(&mut self, n: usize) {
        self.start += n;
        self.want_bytes = 0;
        debug_assert!(self.start <= self.end);
    }

    /// Bytes still to arrive for the frame being waited for (0 if unknown).
    pub fn missing(&self) -> usize {
        self.want_bytes.saturating_sub(self.end - self.start)
    }

    /// Give back memory grown for a large request. Called when the
    /// connection goes idle, not per request: a stream of large WRITEs
    /// keeps its buffer.
    pub fn shrink_if_empty(&mut self) {
        if self.start == self.end && self.buf.len() > self.base_bytes {
            self.buf = vec![0; self.base_bytes];
            self.start = 0;
            self.end = 0;
        }
    }

    /// Throw the next `n` bytes away, whether received yet or not.
    pub fn skip(&mut self, n: u64) {
        self.skip_bytes += n;
        self.drop_skipped();
    }

    /// True while skipped bytes are still to arrive.
    pub fn is_skipping(&self) -> bool {
        self.skip_bytes > 0
    }

    fn drop_skipped(&mut self) {
        let n = (self.end - self.start).min(usize::try_from(self.skip_bytes).unwrap_or(usize::MAX));
        self.start += n;
        self.skip_bytes -= n as u64;
    }

    /// Make sure a frame of `total` bytes starting at `pending()` fits,
    /// growing (once per large WRITE) or compacting as needed.
    pub fn make_room(&mut self, total: usize) {
        self.want_bytes = total;
        if self.buf.len() < total {
            let mut bigger = vec![0; total];
            bigger[..self.end - self.start].copy_from_slice(self.pending());
            self.buf = bigger;
            self.end -= self.start;
            self.start = 0;
        } else if self.start + total > self.buf.len() {
            self.compact();
        }
    }

    fn compact(&mut self) {
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
    }

    /// One blocking `read` from `r` into the free space. Ok(0) means end of
    /// stream.
    pub fn read_from(&mut self, r: &mut impl Read) -> io::Result<usize> {
        let read = |b: &mut [u8]| loop {
            match r.read(b) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other.map(Some),
            }
        };
        Ok(self.fill(read)?.unwrap_or(0))
    }

    /// Let `recv` fill the free space; it returns the bytes it put there, or
    /// None if it had none to give yet.
    pub fn fill(
        &mut self,
        recv: impl FnOnce(&mut [u8]) -> io::Result<Option<usize>>,
    ) -> io::Result<Option<usize>> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.compact();
        }
        if self.end == self.buf.len() {
            // `next_frame` makes room for every frame it waits for, so a
            // full buffer is a bug here; never mistake it for end of stream.
            return Err(io::Error::other("nbd input buffer full without a whole request"));
        }
        let got = recv(&mut self.buf[self.end..])?;
        if let Some(n) = got {
            self.end += n;
            self.drop_skipped();
        }
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inbuf_grows_for_a_large_frame_and_skips_across_reads() {
        let mut b = InBuf::new(16);
        let mut src: &[u8] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        b.read_from(&mut src).unwrap();
        b.consume(2);
        b.make_room(40);
        assert_eq!(b.pending(), &[3, 4, 5, 6, 7, 8, 9, 10]);
        b.consume(8);
        b.skip(5);
        assert!(b.is_skipping());
        let mut src: &[u8] = &[0, 0, 0, 0, 0, 42];
        b.read_from(&mut src).unwrap();
        assert!(!b.is_skipping());
        assert_eq!(b.pending(), &[42]);
    }
}
