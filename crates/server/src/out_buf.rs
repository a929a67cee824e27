//! A connection's reply buffer, shared by the page server and the NBD
//! server: replies are appended and go out with one `write`. The vector
//! keeps its high-water length, so read replies are filled in place without
//! zeroing them again, and steady state allocates nothing.
//!
//! A reply may also take pages lent in place by the store (`in_place`),
//! sent with `writev` straight from the store's memory: a sealed READ on a
//! RAM slab, whose pages the borrower checks against their tags, so a
//! writer racing the send costs a re-read there, not wrong bytes.

use memlend_store::{InPlace, PageStore};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// iovecs per `writev` (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;

/// Pages lent in place, sent after the first `at` bytes of the buffer;
/// `_keep` holds the store that lent them, so they stay mapped.
struct Lent {
    at: usize,
    mem: InPlace,
    _keep: Arc<dyn PageStore>,
}

/// Replies waiting to be written with one `write`. `len` is what is in use;
/// the vector keeps its high-water length so that reads can fill reserved
/// space without zeroing it again.
pub(crate) struct OutBuf {
    buf: Vec<u8>,
    len: usize,
    keep_bytes: usize,
    lent: Vec<Lent>,
    lent_bytes: usize,
}

impl OutBuf {
    pub fn new(keep_bytes: usize) -> Self {
        OutBuf { buf: Vec::new(), len: 0, keep_bytes, lent: Vec::new(), lent_bytes: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0 && self.lent.is_empty()
    }

    /// Bytes waiting: the buffer's and those lent in place.
    pub fn pending_bytes(&self) -> usize {
        self.len + self.lent_bytes
    }

    /// Send `mem` after what is in the buffer now; `keep` is the store
    /// that lent it.
    pub fn push_in_place(&mut self, mem: InPlace, keep: Arc<dyn PageStore>) {
        self.lent_bytes += mem.len;
        self.lent.push(Lent { at: self.len, mem, _keep: keep });
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
        let kept = self.len;
        self.lent.retain(|l| l.at <= kept);
        self.lent_bytes = self.lent.iter().map(|l| l.mem.len).sum();
    }

    /// Forget the contents, keeping the memory for the next batch.
    pub fn clear(&mut self) {
        self.len = 0;
        self.lent.clear();
        self.lent_bytes = 0;
    }

    /// Write everything to `sock` (blocking) and clear.
    pub fn write_to<W: Write + AsRawFd>(&mut self, sock: &mut W) -> io::Result<()> {
        if self.lent.is_empty() {
            sock.write_all(self.as_slice())?;
        } else {
            writev_all(sock.as_raw_fd(), &mut self.iovecs())?;
        }
        self.clear();
        Ok(())
    }

    /// The buffer cut at each lent part, in order.
    fn iovecs(&self) -> Vec<libc::iovec> {
        let mut v = Vec::with_capacity(2 * self.lent.len() + 1);
        let mut from = 0;
        let mut piece = |ptr: *const u8, len: usize| {
            if len > 0 {
                v.push(libc::iovec { iov_base: ptr as *mut libc::c_void, iov_len: len });
            }
        };
        for l in &self.lent {
            piece(self.buf[from..].as_ptr(), l.at - from);
            piece(l.mem.ptr, l.mem.len);
            from = l.at;
        }
        piece(self.buf[from..].as_ptr(), self.len - from);
        v
    }

    /// Give back memory above `keep_bytes` (when the connection goes idle).
    pub fn shrink_if_empty(&mut self) {
        if self.len == 0 && self.buf.len() > self.keep_bytes {
            self.buf = Vec::new();
        }
    }
}

/// `writev` until every byte of `iov` is written, `IOV_MAX` at a time.
fn writev_all(fd: i32, iov: &mut [libc::iovec]) -> io::Result<()> {
    let mut first = 0;
    while first < iov.len() {
        let batch = &iov[first..iov.len().min(first + IOV_MAX)];
        // SAFETY: each iovec points into the OutBuf's vector, which is not
        // touched during the call, or at memory a store lent in place, which
        // stays mapped while the OutBuf holds that store; the kernel only
        // reads through them.
        let n = unsafe { libc::writev(fd, batch.as_ptr(), batch.len() as i32) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        first = advance(iov, first, n as usize);
    }
    Ok(())
}

/// Past `n` bytes written from `iov[first..]` (at most what they hold): the
/// first iovec not wholly written, trimmed of what was.
fn advance(iov: &mut [libc::iovec], mut first: usize, mut n: usize) -> usize {
    while n > 0 && n >= iov[first].iov_len {
        n -= iov[first].iov_len;
        first += 1;
    }
    if n > 0 {
        let v = &mut iov[first];
        v.iov_base = (v.iov_base as usize + n) as *mut libc::c_void;
        v.iov_len -= n;
    }
    first
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

    /// Buffered bytes and pages lent by a RAM store go out interleaved in
    /// order, more than a socket buffer's worth; a truncation drops what
    /// was lent after its point.
    #[test]
    fn lent_pages_go_out_in_order_with_the_buffer() {
        use memlend_store::ram::{RamOptions, RamStore};
        use memlend_store::{WriteOp, PAGE_SIZE};
        use std::io::Read;
        let ram = Arc::new(RamStore::new(1024, RamOptions::default()).unwrap());
        let data: Vec<u8> = (0..1024 * PAGE_SIZE).map(|i| (i / 7 % 251) as u8).collect();
        ram.write(&[WriteOp { page: 0, data: &data }]).unwrap();
        let lend = |page: u64, count: u64| ram.in_place(page, count).unwrap().unwrap();
        let keep = || Arc::clone(&ram) as Arc<dyn PageStore>;
        let mut o = OutBuf::new(0);
        let mut want = Vec::new();
        for (i, (page, count)) in [(0u64, 256u64), (300, 1), (512, 512)].into_iter().enumerate() {
            let head = vec![i as u8 + 1; 40 + i];
            o.extend(&head);
            want.extend_from_slice(&head);
            o.push_in_place(lend(page, count), keep());
            let at = page as usize * PAGE_SIZE;
            want.extend_from_slice(&data[at..at + count as usize * PAGE_SIZE]);
        }
        o.extend(b"tail");
        want.extend_from_slice(b"tail");
        let undo = o.len();
        o.extend(b"undone");
        o.push_in_place(lend(9, 1), keep());
        o.truncate(undo);
        assert_eq!(o.pending_bytes(), want.len());
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            b.read_to_end(&mut got).unwrap();
            got
        });
        o.write_to(&mut a).unwrap();
        assert!(o.is_empty());
        drop(a);
        assert!(reader.join().unwrap() == want, "bytes out of order or lost");
    }

    /// A `writev` that wrote part of a batch resumes where it stopped.
    #[test]
    fn a_partial_writev_resumes_mid_piece() {
        let bytes = [0u8; 10];
        let base = bytes.as_ptr() as usize;
        let iov = |at: usize, len: usize| libc::iovec {
            iov_base: (base + at) as *mut libc::c_void,
            iov_len: len,
        };
        let mut v = [iov(0, 3), iov(3, 4), iov(7, 3)];
        assert_eq!(advance(&mut v, 0, 2), 0);
        assert_eq!((v[0].iov_base as usize - base, v[0].iov_len), (2, 1));
        assert_eq!(advance(&mut v, 0, 1), 1, "the rest of the first piece");
        assert_eq!(advance(&mut v, 1, 6), 2);
        assert_eq!((v[2].iov_base as usize - base, v[2].iov_len), (9, 1));
        assert_eq!(advance(&mut v, 2, 1), 3, "all written");
    }
}
