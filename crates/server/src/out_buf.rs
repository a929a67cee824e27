//! A connection's reply buffer, shared by the page server and the NBD
//! server: replies are appended and go out with one `write`. The vector
//! keeps its high-water length, so read replies are filled in place without
//! zeroing them again, and steady state allocates nothing.

/// Replies waiting to be written with one `write`. `len` is what is in use;
/// the vector keeps its high-water length so that reads can fill reserved
/// space without zeroing it again.
pub(crate) struct OutBuf {
    buf: Vec<u8>,
    len: usize,
    keep_bytes: usize,
}

impl OutBuf {
    pub fn new(keep_bytes: usize) -> Self {
        OutBuf { buf: Vec::new(), len: 0, keep_bytes }
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

    pub fn extend(&mut self, b: &[u8]) {
        self.reserve(b.len()).copy_from_slice(b);
    }

    /// Append `n` bytes of unspecified content and return them for filling.
    pub fn reserve(&mut self, n: usize) -> &mut [u8] {
        let at = self.len;
        if self.buf.len() < at + n {
            self.buf.resize(at + n, 0);
        }
        self.len = at + n;
        &mut self.buf[at..at + n]
    }

    /// Bytes `at..at + n` of what is in use, to fill in a header late.
    pub fn range_mut(&mut self, at: usize, n: usize) -> &mut [u8] {
        &mut self.buf[at..at + n]
    }

    /// Drop everything after the first `len` bytes (undo a reservation).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Forget the contents, keeping the memory for the next batch.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Give back memory above `keep_bytes` (when the connection goes idle).
    pub fn shrink_if_empty(&mut self) {
        if self.len == 0 && self.buf.len() > self.keep_bytes {
            self.buf = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbuf_reserves_truncates_and_clears() {
        let mut o = OutBuf::new(8);
        o.extend(&[1, 2]);
        o.reserve(3).copy_from_slice(&[3, 4, 5]);
        o.truncate(4);
        assert_eq!(o.as_slice(), &[1, 2, 3, 4]);
        o.range_mut(0, 1)[0] = 9;
        assert_eq!(o.as_slice()[0], 9);
        o.reserve(100);
        o.clear();
        assert!(o.is_empty());
        o.shrink_if_empty();
        assert!(o.is_empty());
    }
}
