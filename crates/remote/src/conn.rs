//! One authenticated connection to a donor, with pipelined tagged requests.

use crate::{ClientConfig, ClientError};
use memlend_wire::page::REP_HEADER_LEN;
use memlend_wire::page::{self, Auth, Challenge, Hello, RepHeader, ReqHeader, Status, Welcome};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Receive buffer: big enough to take many small replies per syscall; large
/// payloads bypass it and go straight into the caller's buffer.
const RECV_BUF_BYTES: usize = 256 << 10;
/// Acknowledged bytes at the front of the send buffer before it is
/// compacted.
const COMPACT_BYTES: usize = 1 << 20;
/// Capacity the send buffer keeps once every request in it is answered.
/// A batch of writes grows it to 4 MiB; kept, four connections held 13.5
/// MiB of a process that `memlend run --mem` must keep within its limit.
const OUT_KEEP_BYTES: usize = 256 << 10;

/// A request sent (or queued) and not yet answered: kept, whole, in `out`
/// until its reply comes, so that it can be sent again after a resume.
struct Unacked {
    seq: u64,
    /// Where the frame ends in `out`; it starts where the previous one ends
    /// (the first at `head`).
    end: usize,
    acked: bool,
}

/// One connection to a donor, in one session. Requests are numbered in the
/// session and kept until answered; when the connection breaks, `recover`
/// reconnects, resumes the session and sends the unanswered ones again,
/// and the donor applies each exactly once (see the server's
/// `sessions.rs`).
pub struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    cfg: ClientConfig,
    /// Frames from `head` on are unanswered; bytes before `sent` are on the
    /// wire.
    out: Vec<u8>,
    head: usize,
    sent: usize,
    unacked: VecDeque<Unacked>,
    resumes_left: u32,
    /// Sessions resumed on a new connection, since connect.
    pub resumes: u64,
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    scratch: Vec<u8>,
    next_tag: u32,
    next_seq: u64,
    spin: std::time::Duration,
    pub batch_pages_max: u32,
    pub inflight_max: u32,
    pub session_id: u64,
    pub lend_pages: u64,
}

impl Conn {
    /// Connect and authenticate. Every wait is bounded by the config.
    pub fn connect(addr: SocketAddr, cfg: &ClientConfig) -> Result<Conn, ClientError> {
        let stream = Self::open_stream(addr, cfg)?;
        let mut conn = Conn {
            stream,
            peer: addr,
            cfg: cfg.clone(),
            out: Vec::with_capacity(64 << 10),
            head: 0,
            sent: 0,
            unacked: VecDeque::new(),
            resumes_left: cfg.retries_max,
            resumes: 0,
            rbuf: vec![0; RECV_BUF_BYTES],
            rstart: 0,
            rend: 0,
            scratch: Vec::new(),
            next_tag: 0,
            next_seq: 1,
            spin: cfg.spin_before_sleep,
            batch_pages_max: 0,
            inflight_max: 0,
            session_id: 0,
            lend_pages: 0,
        };
        conn.handshake(0)?;
        Ok(conn)
    }

    fn open_stream(addr: SocketAddr, cfg: &ClientConfig) -> io::Result<TcpStream> {
        let stream = TcpStream::connect_timeout(&addr, cfg.connect_timeout)?;
        stream.set_nodelay(true)?;
        memlend_net::set_liveness(&stream, &memlend_net::Liveness::default())?;
        stream.set_read_timeout(Some(cfg.io_timeout))?;
        stream.set_write_timeout(Some(cfg.io_timeout))?;
        Ok(stream)
    }

    /// After `e` broke the connection: reconnect, resume the session and
    /// send every unanswered request again. Gives `e` back when it is not a
    /// transport failure or the attempts (`retries_max` since the last
    /// reply) are used up.
    pub fn recover(&mut self, e: ClientError) -> Result<(), ClientError> {
        let mut last = e;
        while last.is_transport() && self.resumes_left > 0 {
            let attempt = self.cfg.retries_max - self.resumes_left;
            self.resumes_left -= 1;
            tracing::warn!(peer = %self.peer, error = %last, attempt, "connection lost; resuming the session");
            std::thread::sleep(Duration::from_millis(10 << attempt.min(6)));
            match self.resume() {
                Ok(resumed) => {
                    self.resumes += 1;
                    let pending = self.unacked.len();
                    tracing::info!(peer = %self.peer, resumed, pending, "session resumed");
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A new connection in the same session, every unanswered request sent
    /// again on it; returns the last request the donor had applied.
    fn resume(&mut self) -> Result<u64, ClientError> {
        self.stream = Self::open_stream(self.peer, &self.cfg)?;
        (self.rstart, self.rend) = (0, 0);
        let resumed = self.handshake(self.session_id)?;
        self.resend()?;
        Ok(resumed)
    }

    /// Write every unanswered frame again, in order.
    fn resend(&mut self) -> io::Result<()> {
        let mut start = self.head;
        for f in &self.unacked {
            if !f.acked {
                self.stream.write_all(&self.out[start..f.end])?;
            }
            start = f.end;
        }
        self.sent = self.out.len();
        Ok(())
    }

    /// Request `seq` was answered: drop it, and every answered frame before
    /// it, from the send buffer.
    fn ack(&mut self, seq: u64) {
        if let Some(f) = self.unacked.iter_mut().find(|f| f.seq == seq) {
            f.acked = true;
            self.resumes_left = self.cfg.retries_max;
        }
        while self.unacked.front().is_some_and(|f| f.acked) {
            self.head = self.unacked.pop_front().expect("front exists").end;
        }
        if self.unacked.is_empty() && self.sent == self.out.len() {
            (self.head, self.sent) = (0, 0);
            self.out.clear();
            self.out.shrink_to(OUT_KEEP_BYTES);
        } else if self.head >= COMPACT_BYTES {
            self.out.drain(..self.head);
            self.unacked.iter_mut().for_each(|f| f.end -= self.head);
            self.sent -= self.head;
            self.head = 0;
        }
    }

    /// A second handle on the socket, for tests that speak raw frames.
    pub fn try_clone_stream(&self) -> io::Result<TcpStream> {
        self.stream.try_clone()
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// HELLO .. WELCOME, for a new session (`resume == 0`) or to resume
    /// one; returns the last request the session applied.
    fn handshake(&mut self, resume: u64) -> Result<u64, ClientError> {
        let cfg = self.cfg.clone();
        let mut client_nonce = [0u8; page::NONCE_LEN];
        getrandom::getrandom(&mut client_nonce).expect("the kernel's random source is available");
        let hello = Hello {
            version_min: page::VERSION,
            version_max: page::VERSION,
            borrower_id: cfg.borrower_id,
            client_nonce,
            resume_session: resume,
        };
        self.stream.write_all(&hello.encode())?;
        let mut buf = [0u8; Welcome::LEN];
        self.stream.read_exact(&mut buf[..Challenge::LEN])?;
        let ch = match Challenge::decode(&buf[..Challenge::LEN]) {
            Ok(ch) => ch,
            // A refusal (wrong version) comes as a WELCOME instead.
            Err(_) => return Err(self.refusal(&mut buf, Challenge::LEN)),
        };
        if ch.insecure && !cfg.allow_insecure {
            return Err(ClientError::InsecureDonor);
        }
        let id = &cfg.borrower_id;
        let mac = match (&cfg.key, ch.insecure) {
            (Some(k), false) => page::client_mac(k, &client_nonce, &ch.server_nonce, id, resume),
            _ => [0; page::MAC_LEN],
        };
        self.stream.write_all(&Auth { mac }.encode())?;
        self.stream.read_exact(&mut buf)?;
        let w = Welcome::decode(&buf)?;
        if w.status != Status::Ok {
            return Err(ClientError::Refused(w.status));
        }
        if let (Some(k), false) = (&cfg.key, ch.insecure) {
            let seqs = (w.session_id, w.resumed_seq);
            let expected = page::server_mac(k, &client_nonce, &ch.server_nonce, id, seqs);
            if !page::verify_mac(&expected, &w.mac) {
                return Err(ClientError::ServerAuth);
            }
        }
        if w.batch_pages_max == 0 || w.inflight_max == 0 {
            return Err(ClientError::Protocol("donor offered zero limits".into()));
        }
        self.batch_pages_max = w.batch_pages_max.min(page::limits::BATCH_PAGES_MAX);
        self.inflight_max = w.inflight_max.min(page::limits::INFLIGHT_MAX);
        if resume != 0 && w.session_id != resume {
            return Err(ClientError::Protocol(format!(
                "asked to resume {resume:#x}, got {:#x}",
                w.session_id
            )));
        }
        self.session_id = w.session_id;
        self.lend_pages = w.lend_pages;
        Ok(w.resumed_seq)
    }

    /// Read the rest of a WELCOME whose first `have` bytes are in `buf`.
    fn refusal(&mut self, buf: &mut [u8; Welcome::LEN], have: usize) -> ClientError {
        if let Err(e) = self.stream.read_exact(&mut buf[have..]) {
            return e.into();
        }
        match Welcome::decode(buf) {
            Ok(w) => ClientError::Refused(w.status),
            Err(e) => e.into(),
        }
    }

    /// Queue a request (the bytes leave on the next `send`). Fills in tag,
    /// sequence number, payload length and CRC; returns the tag.
    pub fn queue(&mut self, mut h: ReqHeader, payload: &[&[u8]]) -> u32 {
        h.tag = self.next_tag;
        h.seq = self.next_seq;
        // FATAL_TAG is the server's; a client tag never takes it.
        self.next_tag = (self.next_tag + 1) % page::FATAL_TAG;
        self.next_seq += 1;
        h.payload_len = payload.iter().map(|p| p.len()).sum::<usize>() as u32;
        h.payload_crc =
            if h.payload_len == 0 { 0 } else { page::payload_crc_iov(payload.iter().copied()) };
        self.out.extend_from_slice(&h.encode());
        for p in payload {
            self.out.extend_from_slice(p);
        }
        self.unacked.push_back(Unacked { seq: h.seq, end: self.out.len(), acked: false });
        h.tag
    }

    /// Send everything queued, in one write where the kernel allows.
    pub fn send(&mut self) -> io::Result<()> {
        if self.sent < self.out.len() {
            self.stream.write_all(&self.out[self.sent..])?;
            self.sent = self.out.len();
        }
        Ok(())
    }

    /// The tag the next `queue` will use.
    pub fn next_tag(&self) -> u32 {
        self.next_tag
    }

    /// The sequence number the next `queue` will use.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Receive one reply. `dest` says where its payload goes: buffers of
    /// exactly `payload_len` bytes together, or None for `scratch()`. A
    /// reply with a non-Ok status is returned as is; the caller decides.
    pub fn recv<'b>(
        &mut self,
        dest: impl FnOnce(&RepHeader) -> Option<Dest<'b>>,
    ) -> Result<RepHeader, ClientError> {
        let mut head = [0u8; REP_HEADER_LEN];
        self.read_buffered(&mut head)?;
        let h = RepHeader::decode(&head)?;
        if h.tag == page::FATAL_TAG && h.status != Status::Ok {
            return Err(ClientError::Protocol(format!(
                "donor closed the connection: {}",
                h.status
            )));
        }
        let len = h.payload_len as usize;
        if len == 0 {
            self.ack(h.seq);
            return Ok(h);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let (head, data, sealed): (&mut [u8], &mut [u8], bool) = match dest(&h) {
            Some(d) if d.head.len() + d.data.len() == len => (d.head, d.data, d.sealed),
            Some(d) => {
                self.scratch = scratch;
                return Err(ClientError::Protocol(format!(
                    "reply payload is {len} bytes, expected {}",
                    d.head.len() + d.data.len()
                )));
            }
            None => {
                scratch.resize(len, 0);
                (&mut [], &mut scratch[..], false)
            }
        };
        let read = self.read_buffered(head).and_then(|()| self.read_buffered(data));
        // A sealed READ's CRC covers its sidecars only (see `Dest`).
        let covered: [&[u8]; 2] = match sealed {
            false => [&*head, &*data],
            true => [&*head, &[]],
        };
        let crc_ok = read.is_ok() && page::payload_crc_iov(covered) == h.payload_crc;
        self.scratch = scratch;
        read?;
        if !crc_ok {
            return Err(ClientError::Status(Status::BadPayloadCrc));
        }
        self.ack(h.seq);
        Ok(h)
    }

    /// Reply bytes already received and not yet consumed: when this holds a
    /// whole header, `recv` will not block.
    pub fn buffered_bytes(&self) -> usize {
        self.rend - self.rstart
    }

    /// The payload of the last reply received without a destination.
    pub fn scratch(&self) -> &[u8] {
        &self.scratch
    }

    /// Queue, send and receive one request (no pipelining), resuming the
    /// session if the connection breaks meanwhile.
    pub fn call(
        &mut self,
        h: ReqHeader,
        payload: &[&[u8]],
        mut dest: Option<&mut [u8]>,
    ) -> Result<RepHeader, ClientError> {
        let tag = self.queue(h, payload);
        let r = loop {
            let sent = self.send().map_err(ClientError::from);
            match sent.and_then(|()| self.recv(|_| dest.as_deref_mut().map(Dest::from))) {
                Ok(r) => break r,
                Err(e) => self.recover(e)?,
            }
        };
        if r.tag != tag {
            return Err(ClientError::Protocol(format!("reply tag {} for request {tag}", r.tag)));
        }
        match r.status {
            Status::Ok => Ok(r),
            s => Err(ClientError::Status(s)),
        }
    }

    /// Fill `dst` from the receive buffer, then straight from the socket.
    fn read_buffered(&mut self, dst: &mut [u8]) -> io::Result<()> {
        let have = (self.rend - self.rstart).min(dst.len());
        dst[..have].copy_from_slice(&self.rbuf[self.rstart..self.rstart + have]);
        self.rstart += have;
        let rest = &mut dst[have..];
        if rest.is_empty() {
            return Ok(());
        }
        if rest.len() >= RECV_BUF_BYTES / 2 {
            return self.stream.read_exact(rest);
        }
        self.rstart = 0;
        self.rend = 0;
        let mut filled = 0;
        while filled < rest.len() {
            let free = &mut self.rbuf[self.rend..];
            let got = match memlend_net::recv_spinning(&self.stream, free, self.spin)? {
                Some(n) => Ok(n),
                None => self.stream.read(free),
            };
            let n = match got {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.rend += n;
            let take = (rest.len() - filled).min(self.rend - self.rstart);
            rest[filled..filled + take]
                .copy_from_slice(&self.rbuf[self.rstart..self.rstart + take]);
            self.rstart += take;
            filled += take;
        }
        Ok(())
    }
}

/// Where a reply's payload goes: `head`, then `data` (a sealed READ's
/// sidecars, then its pages: the small part first, so that the pages are
/// read straight from the socket once the sidecars are in).
pub struct Dest<'b> {
    pub head: &'b mut [u8],
    pub data: &'b mut [u8],
    /// A sealed READ's reply: its payload CRC covers `head` (the sidecars)
    /// only, and each page of `data` is checked against its AEAD tag above
    /// this crate.
    pub sealed: bool,
}

impl<'b> From<&'b mut [u8]> for Dest<'b> {
    fn from(data: &'b mut [u8]) -> Self {
        Dest { head: &mut [], data, sealed: false }
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("peer", &self.peer).field("session", &self.session_id).finish()
    }
}
