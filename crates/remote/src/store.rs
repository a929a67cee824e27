//! `remote`: a `PageStore` over one slab on one donor. A slab opened
//! sealed (`open_sealed`) also keeps a sidecar beside every page on the
//! donor (`SidecarStore`): that is where `crypt` keeps its tags.

use crate::{ClientConfig, ClientError, Conn, Dest};
use memlend_store::{batch_pages, check_range, check_run, Caps, PageStore, ReadOp, StoreInfo};
use memlend_store::{Sidecar, SidecarStore, StoreError, StoreResult, WriteOp, PAGE_SIZE};
use memlend_wire::page::{Opcode, ReqHeader, StatReply, Status, FLAG_SEALED, SIDECAR_LEN};
use parking_lot::{Condvar, Mutex};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of write payload queued per connection before it must drain
/// replies: bounds the client's buffer while keeping the pipe full.
const INFLIGHT_BYTES_MAX: usize = 4 << 20;

pub struct RemoteStore {
    addr: SocketAddr,
    cfg: ClientConfig,
    slab: u32,
    pages: u64,
    /// The slab keeps sidecars (`FLAG_SEALED`).
    sealed: bool,
    pool: Mutex<Pool>,
    freed: Condvar,
    reconnects: AtomicU64,
}

struct Pool {
    idle: Vec<Conn>,
    open: usize,
}

/// One protocol request of a batch and the caller memory it reads or
/// writes: pages, and their sidecars (empty unless sealed).
enum Piece<'a> {
    Read { page: u64, buf: &'a mut [u8], side: &'a mut [u8] },
    Write { page: u64, data: &'a [u8], side: &'a [u8] },
}

impl Piece<'_> {
    fn len_bytes(&self) -> usize {
        match self {
            Piece::Read { buf, .. } => buf.len(),
            Piece::Write { data, side, .. } => data.len() + side.len(),
        }
    }
}

impl RemoteStore {
    /// Connect to `addr` and open a new slab of `pages` pages there.
    pub fn open(addr: SocketAddr, cfg: ClientConfig, pages: u64) -> Result<Self, ClientError> {
        Self::open_slab(addr, cfg, pages, false)
    }

    /// `open`, for a slab that keeps a sidecar beside every page on the
    /// donor (16 bytes a page of the donor's memory, not this process's).
    pub fn open_sealed(
        addr: SocketAddr,
        cfg: ClientConfig,
        pages: u64,
    ) -> Result<Self, ClientError> {
        Self::open_slab(addr, cfg, pages, true)
    }

    fn open_slab(
        addr: SocketAddr,
        cfg: ClientConfig,
        pages: u64,
        sealed: bool,
    ) -> Result<Self, ClientError> {
        let mut conn = Conn::connect(addr, &cfg)?;
        let flags = if sealed { FLAG_SEALED } else { 0 };
        let h = ReqHeader { page: pages, flags, ..ReqHeader::new(Opcode::OpenSlab, 0) };
        let slab = conn.call(h, &[], None)?.value;
        let slab = u32::try_from(slab)
            .map_err(|_| ClientError::Protocol(format!("slab id {slab} out of range")))?;
        tracing::debug!(%addr, slab, pages, sealed, "slab opened");
        crate::linger::remember(addr, &cfg);
        let pool = Pool { idle: vec![conn], open: 1 };
        let (pool, freed, reconnects) = (Mutex::new(pool), Condvar::new(), AtomicU64::new(0));
        Ok(RemoteStore { addr, cfg, slab, pages, sealed, pool, freed, reconnects })
    }

    pub fn slab(&self) -> u32 {
        self.slab
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sessions resumed on a new connection after a transport failure,
    /// since open.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// The donor's view of its budget and of this borrower.
    pub fn stat(&self) -> StoreResult<StatReply> {
        self.with_conn("stat", |conn| {
            conn.call(ReqHeader::new(Opcode::Stat, 0), &[], None)?;
            Ok(StatReply::decode(conn.scratch())?)
        })
    }

    /// Run `f` on a connection of the pool. A connection that breaks
    /// resumes its session by itself (`Conn::recover`), so a request is never
    /// sent on a fresh session while an older copy of it may still be
    /// applied; once it gives up, the error is the caller's.
    fn with_conn<T>(
        &self,
        what: &str,
        mut f: impl FnMut(&mut Conn) -> Result<T, ClientError>,
    ) -> StoreResult<T> {
        let mut conn = self.checkout().map_err(|e| e.into_store_error(what))?;
        let resumes_before = conn.resumes;
        let result = f(&mut conn);
        self.reconnects.fetch_add(conn.resumes - resumes_before, Ordering::Relaxed);
        match result {
            Ok(v) => {
                self.checkin(Some(conn));
                Ok(v)
            }
            Err(e) => {
                self.checkin((!e.is_transport()).then_some(conn));
                Err(e.into_store_error(what))
            }
        }
    }

    fn checkout(&self) -> Result<Conn, ClientError> {
        let mut pool = self.pool.lock();
        loop {
            if let Some(c) = pool.idle.pop() {
                return Ok(c);
            }
            if pool.open < self.cfg.connections_max {
                pool.open += 1;
                drop(pool);
                let conn = Conn::connect(self.addr, &self.cfg);
                if conn.is_err() {
                    self.checkin(None);
                }
                return conn;
            }
            if self.freed.wait_for(&mut pool, self.cfg.io_timeout).timed_out() {
                return Err(ClientError::Protocol("no connection became free in time".into()));
            }
        }
    }

    /// Return a connection to the pool, or `None` for one that broke.
    fn checkin(&self, conn: Option<Conn>) {
        let mut pool = self.pool.lock();
        match conn {
            Some(c) => pool.idle.push(c),
            None => pool.open -= 1,
        }
        self.freed.notify_one();
    }

    fn run(&self, what: &str, pieces: &mut [Piece]) -> StoreResult<()> {
        let slab = self.slab;
        self.with_conn(what, |conn| run_pieces(conn, slab, pieces))
    }

    /// Requests of at most `max` pages each; `side` holds the sidecars of
    /// every page of `ops` in order (`SIDECAR_LEN` each), or is empty.
    fn split_reads<'a>(
        ops: &'a mut [ReadOp<'_>],
        mut side: &'a mut [u8],
        max: usize,
    ) -> Vec<Piece<'a>> {
        let per_page = side.len() / batch_pages(ops.iter().map(|op| op.buf.len())).max(1);
        let mut pieces = Vec::new();
        for op in ops.iter_mut() {
            for (i, buf) in op.buf.chunks_mut(max * PAGE_SIZE).enumerate() {
                let (mine, rest) = side.split_at_mut(buf.len() / PAGE_SIZE * per_page);
                side = rest;
                pieces.push(Piece::Read { page: op.page + (i * max) as u64, buf, side: mine });
            }
        }
        pieces
    }

    fn split_writes<'a>(ops: &'a [WriteOp<'_>], mut side: &'a [u8], max: usize) -> Vec<Piece<'a>> {
        let per_page = side.len() / batch_pages(ops.iter().map(|op| op.data.len())).max(1);
        let mut pieces = Vec::new();
        for op in ops {
            for (i, data) in op.data.chunks(max * PAGE_SIZE).enumerate() {
                let (mine, rest) = side.split_at(data.len() / PAGE_SIZE * per_page);
                side = rest;
                pieces.push(Piece::Write { page: op.page + (i * max) as u64, data, side: mine });
            }
        }
        pieces
    }

    fn check_sealed(&self, pages: usize, side: usize) -> StoreResult<()> {
        if !self.sealed {
            let why = format!("slab {} on {} was not opened sealed", self.slab, self.addr);
            return Err(StoreError::Unavailable(why));
        }
        if pages != side {
            return Err(StoreError::Misaligned { len_bytes: side * SIDECAR_LEN });
        }
        Ok(())
    }

    fn batch_pages_max(&self) -> usize {
        let pool = self.pool.lock();
        pool.idle.first().map_or(memlend_wire::page::limits::BATCH_PAGES_MAX, |c| c.batch_pages_max)
            as usize
    }
}

/// Send every piece, at most `inflight_max` requests and `INFLIGHT_BYTES_MAX`
/// of payload at a time, and receive every reply (in any order). On a donor
/// error the remaining replies are still drained so the connection stays in
/// step; the first error is returned.
fn run_pieces(conn: &mut Conn, slab: u32, pieces: &mut [Piece]) -> Result<(), ClientError> {
    let window = conn.inflight_max as usize;
    let mut inflight: Vec<(u32, usize)> = Vec::with_capacity(window);
    let (mut next, mut first_err) = (0, None);
    while next < pieces.len() || !inflight.is_empty() {
        if inflight.len() <= window / 2 {
            let mut queued_bytes = 0;
            while next < pieces.len()
                && inflight.len() < window
                && queued_bytes < INFLIGHT_BYTES_MAX
            {
                queued_bytes += pieces[next].len_bytes();
                inflight.push((queue_piece(conn, slab, &pieces[next]), next));
                next += 1;
            }
            if let Err(e) = conn.send() {
                conn.recover(e.into())?;
            }
        }
        let pieces_ref: &mut [Piece] = pieces;
        let flight = &inflight;
        let got = conn.recv(move |h| {
            let (_, idx) = flight.iter().find(|(t, _)| *t == h.tag)?;
            match &mut pieces_ref[*idx] {
                Piece::Read { buf, side, .. } if h.status == Status::Ok => {
                    // Asked with FLAG_SEALED (`queue_piece`).
                    let sealed = !side.is_empty();
                    Some(Dest { head: side, data: buf, sealed })
                }
                _ => None,
            }
        });
        let r = match got {
            Ok(r) => r,
            // The unanswered requests went out again on the resumed
            // session; their replies come as if nothing happened.
            Err(e) => {
                conn.recover(e)?;
                continue;
            }
        };
        let Some(pos) = inflight.iter().position(|(t, _)| *t == r.tag) else {
            return Err(ClientError::Protocol(format!("reply for unknown tag {}", r.tag)));
        };
        inflight.swap_remove(pos);
        if r.status != Status::Ok && first_err.is_none() {
            first_err = Some(ClientError::Status(r.status));
        }
    }
    first_err.map_or(Ok(()), Err)
}

fn queue_piece(conn: &mut Conn, slab: u32, piece: &Piece) -> u32 {
    let (op, page, count, payload, sealed): (_, _, _, [&[u8]; 2], _) = match piece {
        Piece::Read { page, buf, side } => {
            (Opcode::Read, *page, buf.len() / PAGE_SIZE, [&[], &[]], !side.is_empty())
        }
        Piece::Write { page, data, side } => {
            (Opcode::Write, *page, data.len() / PAGE_SIZE, [side, data], !side.is_empty())
        }
    };
    let flags = if sealed { FLAG_SEALED } else { 0 };
    let h = ReqHeader { slab, page, count: count as u32, flags, ..ReqHeader::new(op, 0) };
    conn.queue(h, &payload)
}

impl PageStore for RemoteStore {
    fn info(&self) -> StoreInfo {
        let caps = Caps { durable: false, discard_frees: true, fast: false, checked: false };
        StoreInfo { pages: self.pages, caps, name: format!("remote({})", self.addr) }
    }

    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        for op in ops.iter() {
            check_run(self.pages, op.page, op.buf.len())?;
        }
        let max = self.batch_pages_max();
        let mut pieces = Self::split_reads(ops, &mut [], max);
        self.run("read", &mut pieces)
    }

    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        for op in ops {
            check_run(self.pages, op.page, op.data.len())?;
        }
        let max = self.batch_pages_max();
        let mut pieces = Self::split_writes(ops, &[], max);
        self.run("write", &mut pieces)
    }

    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        check_range(self.pages, page, count)?;
        let slab = self.slab;
        self.with_conn("discard", |conn| {
            let mut done = 0;
            while done < count {
                let n = (count - done).min(u32::MAX as u64);
                let h = ReqHeader {
                    slab,
                    page: page + done,
                    count: n as u32,
                    ..ReqHeader::new(Opcode::Discard, 0)
                };
                conn.call(h, &[], None)?;
                done += n;
            }
            Ok(())
        })
    }

    fn flush(&self) -> StoreResult<()> {
        let slab = self.slab;
        self.with_conn("flush", |conn| {
            conn.call(ReqHeader { slab, ..ReqHeader::new(Opcode::Flush, 0) }, &[], None).map(drop)
        })
    }
}

impl SidecarStore for RemoteStore {
    fn read_with(&self, ops: &mut [ReadOp<'_>], side: &mut [Sidecar]) -> StoreResult<()> {
        for op in ops.iter() {
            check_run(self.pages, op.page, op.buf.len())?;
        }
        self.check_sealed(batch_pages(ops.iter().map(|op| op.buf.len())), side.len())?;
        let max = self.batch_pages_max();
        let mut pieces = Self::split_reads(ops, side.as_flattened_mut(), max);
        self.run("read", &mut pieces)
    }

    fn write_with(&self, ops: &[WriteOp<'_>], side: &[Sidecar]) -> StoreResult<()> {
        for op in ops {
            check_run(self.pages, op.page, op.data.len())?;
        }
        self.check_sealed(batch_pages(ops.iter().map(|op| op.data.len())), side.len())?;
        let max = self.batch_pages_max();
        let mut pieces = Self::split_writes(ops, side.as_flattened(), max);
        self.run("write", &mut pieces)
    }
}

impl Drop for RemoteStore {
    /// Give the slab back. Best effort: if the donor is gone, its janitor
    /// frees the slab after the grace period anyway.
    fn drop(&mut self) {
        let slab = self.slab;
        let h = ReqHeader { slab, ..ReqHeader::new(Opcode::CloseSlab, 0) };
        let closed = self.pool.get_mut().idle.pop().map(|mut c| c.call(h, &[], None));
        if let Some(Err(e)) = closed {
            tracing::debug!(addr = %self.addr, slab, error = %e, "close slab failed");
        }
    }
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStore")
            .field("addr", &self.addr)
            .field("slab", &self.slab)
            .field("pages", &self.pages)
            .finish()
    }
}
