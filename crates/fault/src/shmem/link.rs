//! How a process hands a shared segment to the server: one message on a
//! Unix socket, a fixed 32-byte hello with the segment's memfd and its
//! userfaultfd attached, answered by one byte. Everything in the hello is
//! checked before the server acts on it.

use crate::kernel::fdpass;
use memlend_store::PAGE_SIZE;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

const MAGIC: u32 = u32::from_le_bytes(*b"MLSH");
const VERSION: u16 = 1;
pub(crate) const HELLO_LEN: usize = 32;
/// The largest segment served: 1 TiB (its page numbers fit a u32).
pub const SEGMENT_BYTES_MAX: u64 = 1 << 40;
/// How long either side waits for the other.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);
const ANSWER_OK: u8 = 0;
const ANSWER_REFUSED: u8 = 1;
/// The status, then the segment's number (u32).
const ANSWER_LEN: usize = 5;

/// A segment as its maker describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub pid: u32,
    /// 0: a new segment (its memfd and userfaultfd attached); else the
    /// segment, as the server numbered it, that a forked child joins (its
    /// userfaultfd attached).
    pub join: u32,
    /// Where it is mapped in the maker (and in every child it forks).
    pub base: u64,
    pub len: u64,
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[8..12].copy_from_slice(&self.pid.to_le_bytes());
        out[12..16].copy_from_slice(&self.join.to_le_bytes());
        out[16..24].copy_from_slice(&self.base.to_le_bytes());
        out[24..32].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Hello, String> {
        if bytes.len() != HELLO_LEN {
            return Err(format!("hello of {} bytes, not {HELLO_LEN}", bytes.len()));
        }
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let magic = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
        let version = u16::from_le_bytes(bytes[4..6].try_into().unwrap());
        if magic != MAGIC || version != VERSION {
            return Err(format!("not a memlend hello (magic {magic:#x}, version {version})"));
        }
        let hello = Hello {
            pid: u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            join: u32::from_le_bytes(bytes[12..16].try_into().unwrap()),
            base: word(16),
            len: word(24),
        };
        let page = PAGE_SIZE as u64;
        if hello.base == 0
            || !hello.base.is_multiple_of(page)
            || hello.len == 0
            || !hello.len.is_multiple_of(page)
        {
            return Err(format!("segment {:#x}+{} is not whole pages", hello.base, hello.len));
        }
        if hello.len > SEGMENT_BYTES_MAX || hello.base.checked_add(hello.len).is_none() {
            return Err(format!("segment of {} bytes is past the limit", hello.len));
        }
        Ok(hello)
    }
}

/// The maker's (or a joining child's) side: hand the descriptors over and
/// wait for the answer: the segment's number.
pub(crate) fn offer(sock: &Path, hello: Hello, fds: &[&OwnedFd]) -> io::Result<u32> {
    let mut stream = UnixStream::connect(sock)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    let raw: Vec<i32> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    fdpass::send(&stream, &hello.encode(), &raw)?;
    let mut answer = [0u8; ANSWER_LEN];
    stream.read_exact(&mut answer)?;
    match answer[0] {
        ANSWER_OK => Ok(u32::from_le_bytes(answer[1..5].try_into().unwrap())),
        _ => Err(io::Error::other("the shared-memory server refused the segment")),
    }
}

/// The server's side: one hello with its descriptors (memfd then uffd for
/// a new segment; uffd alone for a join).
pub(crate) fn take(stream: &UnixStream) -> Result<(Hello, Vec<OwnedFd>), String> {
    stream.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    let mut bytes = [0u8; HELLO_LEN];
    let (n, fds) = fdpass::recv(stream, &mut bytes).map_err(|e| e.to_string())?;
    let hello = Hello::decode(&bytes[..n])?;
    let want = if hello.join == 0 { 2 } else { 1 };
    if fds.len() != want {
        return Err(format!("{} descriptors with the hello, not {want}", fds.len()));
    }
    Ok((hello, fds))
}

/// The server's answer: the segment's number, or a refusal.
pub(crate) fn answer(mut stream: &UnixStream, segment: Option<u32>) {
    let mut out = [ANSWER_REFUSED, 0, 0, 0, 0];
    if let Some(id) = segment {
        out[0] = ANSWER_OK;
        out[1..5].copy_from_slice(&id.to_le_bytes());
    }
    let _ = stream.write_all(&out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_round_trips() {
        let h = Hello { pid: 42, join: 3, base: 0x7f00_0000_0000, len: 640 << 20 };
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn bad_hellos_are_refused_with_a_reason() {
        let good = Hello { pid: 1, join: 0, base: 0x10000, len: 8192 }.encode();
        let mut bad = good;
        bad[0] ^= 1;
        assert!(Hello::decode(&bad).unwrap_err().contains("magic"));
        for (base, len) in [(0, 4096), (0x10001, 4096), (0x10000, 0), (0x10000, 100)] {
            let e = Hello::decode(&Hello { pid: 1, join: 0, base, len }.encode()).unwrap_err();
            assert!(e.contains("whole pages"), "{e}");
        }
        let huge = Hello { pid: 1, join: 0, base: 0x10000, len: SEGMENT_BYTES_MAX + 4096 };
        assert!(Hello::decode(&huge.encode()).unwrap_err().contains("limit"));
        let wraps = Hello { pid: 1, join: 0, base: u64::MAX - 4095, len: 8192 };
        assert!(Hello::decode(&wraps.encode()).is_err());
        assert!(Hello::decode(&good[..31]).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            let mut b = [0u8; HELLO_LEN];
            for byte in &mut b {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *byte = x as u8;
            }
            b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
            b[4..6].copy_from_slice(&VERSION.to_le_bytes());
            if let Ok(h) = Hello::decode(&b) {
                assert!(h.len > 0 && h.len <= SEGMENT_BYTES_MAX && h.base % 4096 == 0);
            }
        }
    }
}
