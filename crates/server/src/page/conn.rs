//! One borrower connection: read every complete request in the buffer, serve
//! each inline on this thread, and send all their replies with one write.
//!
//! Serving inline keeps a request on the core that read it (a cross-core
//! hand-off costs ~10 µs here), and batching replies amortises the syscall
//! over every request that arrived together.

use super::handshake::Accepted;
use super::ops::{serve_request, Outcome};
use super::registry::{BorrowerId, Registry, Slab};
use super::sessions::{changes_state, Done, Session};
use super::stats::{ConnCounters, ServerStats};
use super::PageServerConfig;
use crate::out_buf::OutBuf;
use memlend_net::recv_spinning;
use memlend_wire::page::{limits, Opcode, RepHeader, ReqHeader, Status};
use memlend_wire::page::{FATAL_TAG, REP_HEADER_LEN, REQ_HEADER_LEN};
use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

/// Room for one largest frame plus a batch of small ones.
const IN_BUF_BYTES: usize = REQ_HEADER_LEN + limits::PAYLOAD_BYTES_MAX as usize + (256 << 10);
/// Send buffered replies once they reach this size, even mid-batch.
const OUT_FLUSH_BYTES: usize = 256 << 10;
/// Reply memory kept between batches: one flush batch plus a largest reply.
const OUT_KEEP_BYTES: usize = OUT_FLUSH_BYTES + limits::REPLY_PAYLOAD_BYTES_MAX as usize + 4096;
/// Slabs a connection remembers without asking the registry.
const SLAB_CACHE_LEN: usize = 16;

pub struct Conn<'a> {
    pub stream: TcpStream,
    pub registry: &'a Registry,
    pub borrower: BorrowerId,
    session: Arc<Session>,
    epoch: u64,
    pub batch_pages_max: u32,
    spin: memlend_net::AdaptiveSpin,
    spin_nice: memlend_net::SpinNice,
    pub stats: &'a ServerStats,
    inb: Vec<u8>,
    start: usize,
    end: usize,
    out: OutBuf,
    cache: Vec<(u32, Arc<Slab>)>,
    counters: ConnCounters,
}

/// Why a connection ended other than by a clean close.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("undecodable frame: {0}")]
    Frame(#[from] memlend_wire::page::FrameError),
    #[error("the session was resumed on another connection")]
    Superseded,
    #[error("request seq {seq} skips ahead of the session's {applied}")]
    BadSeq { seq: u64, applied: u64 },
}

impl<'a> Conn<'a> {
    pub fn new(
        stream: TcpStream,
        registry: &'a Registry,
        accepted: Accepted,
        cfg: &PageServerConfig,
        stats: &'a ServerStats,
    ) -> Self {
        Conn {
            stream,
            registry,
            borrower: accepted.borrower_id,
            session: accepted.session,
            epoch: accepted.epoch,
            batch_pages_max: cfg.batch_pages_max,
            spin: memlend_net::AdaptiveSpin::new(cfg.spin_before_sleep),
            spin_nice: memlend_net::SpinNice::new(cfg.spin_nice),
            stats,
            inb: vec![0; IN_BUF_BYTES],
            start: 0,
            end: 0,
            out: OutBuf::new(OUT_KEEP_BYTES),
            cache: Vec::with_capacity(SLAB_CACHE_LEN),
            counters: ConnCounters::default(),
        }
    }

    /// Serve until the peer closes (Ok) or breaks the protocol (Err).
    pub fn run(&mut self) -> Result<(), ConnError> {
        loop {
            let drained = self.drain();
            self.flush()?;
            self.stats.publish(&mut self.counters);
            drained?;
            if !self.fill()? {
                return Ok(());
            }
        }
    }

    /// Serve every complete frame in the input buffer.
    fn drain(&mut self) -> Result<(), ConnError> {
        loop {
            let avail = &self.inb[self.start..self.end];
            if avail.len() < REQ_HEADER_LEN {
                return Ok(());
            }
            let h = match ReqHeader::decode(&avail[..REQ_HEADER_LEN]) {
                Ok(h) => h,
                Err(e) => {
                    let reply = RepHeader::status(e.status(), FATAL_TAG, 0);
                    self.out.extend(&reply.encode());
                    return Err(e.into());
                }
            };
            let frame_len = REQ_HEADER_LEN + h.payload_len as usize;
            if avail.len() < frame_len {
                return Ok(());
            }
            let payload_at = self.start + REQ_HEADER_LEN;
            self.serve(&h, payload_at..self.start + frame_len)?;
            self.start += frame_len;
            if self.out.pending_bytes() >= OUT_FLUSH_BYTES {
                self.flush()?;
            }
        }
    }

    /// Serve one request exactly once: see `sessions.rs`. The session's
    /// lock is held across the store call, so a resume on another
    /// connection waits for it and then fences this one off.
    fn serve(&mut self, h: &ReqHeader, payload: std::ops::Range<usize>) -> Result<(), ConnError> {
        if h.seq == 0 {
            self.apply(h, payload);
            return Ok(());
        }
        let session = Arc::clone(&self.session);
        let mut p = session.lock();
        if p.epoch() != self.epoch {
            return Err(ConnError::Superseded);
        }
        let mutating = Opcode::from_wire(h.opcode).is_some_and(changes_state);
        if h.seq <= p.applied_seq {
            match (mutating, p.result(h.seq)) {
                (false, _) => self.apply(h, payload),
                (true, Some(d)) => self.replay(h, d),
                (true, None) => {
                    self.out.extend(&RepHeader::status(Status::BadSeq, h.tag, h.seq).encode())
                }
            }
            return Ok(());
        }
        if h.seq != p.applied_seq + 1 {
            let reply = RepHeader::status(Status::BadSeq, FATAL_TAG, h.seq);
            self.out.extend(&reply.encode());
            return Err(ConnError::BadSeq { seq: h.seq, applied: p.applied_seq });
        }
        let at = self.out.len();
        self.apply(h, payload);
        let sent = RepHeader::decode(&self.out.as_slice()[at..at + REP_HEADER_LEN])
            .expect("a reply this server just encoded");
        p.record(Done { seq: h.seq, status: sent.status, value: sent.value });
        Ok(())
    }

    /// Answer a replayed request with the result it had.
    fn replay(&mut self, h: &ReqHeader, d: Done) {
        let reply = RepHeader { value: d.value, ..RepHeader::status(d.status, h.tag, h.seq) };
        self.out.extend(&reply.encode());
        self.counters.replays += 1;
    }

    fn apply(&mut self, h: &ReqHeader, payload: std::ops::Range<usize>) {
        let slab = self.slab(h.slab);
        let payload = &self.inb[payload];
        let ctx = super::ops::Ctx {
            registry: self.registry,
            borrower: self.borrower,
            batch_pages_max: self.batch_pages_max,
        };
        let outcome = serve_request(&ctx, h, payload, slab.as_deref(), &mut self.out);
        self.counters.count(&outcome);
        if let Outcome::Closed(id) = outcome {
            self.cache.retain(|(s, _)| *s != id);
        }
    }

    /// The slab named `id`, from the cache or the registry; None if this
    /// borrower has no such open slab.
    fn slab(&mut self, id: u32) -> Option<Arc<Slab>> {
        if let Some(i) = self.cache.iter().position(|(s, _)| *s == id) {
            if self.cache[i].1.is_open() {
                return Some(Arc::clone(&self.cache[i].1));
            }
            self.cache.swap_remove(i);
        }
        let slab = self.registry.get(self.borrower, id)?;
        if self.cache.len() == SLAB_CACHE_LEN {
            self.cache.swap_remove(0);
        }
        self.cache.push((id, Arc::clone(&slab)));
        Some(slab)
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.out.write_to(&mut self.stream)?;
        }
        Ok(())
    }

    /// Read more input; false on a clean end of stream.
    fn fill(&mut self) -> io::Result<bool> {
        if self.start > 0 {
            self.inb.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let waiting = Instant::now();
        let budget = self.spin.budget();
        let into = &mut self.inb[self.end..];
        let spun = match budget.is_zero() {
            true => None,
            false => self.spin_nice.lowered(|| recv_spinning(&self.stream, into, budget))?,
        };
        loop {
            let got = match spun {
                Some(n) => Ok(n),
                None => self.stream.read(&mut self.inb[self.end..]),
            };
            self.spin.waited(waiting.elapsed());
            match got {
                Ok(0) if self.end > 0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("peer closed with {} bytes of a frame unread", self.end),
                    ))
                }
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}
