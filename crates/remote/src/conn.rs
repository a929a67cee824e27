//! One authenticated connection to a donor, with pipelined tagged requests.

use crate::{ClientConfig, ClientError};
use memlend_wire::page::REP_HEADER_LEN;
use memlend_wire::page::{self, Auth, Challenge, Hello, RepHeader, ReqHeader, Status, Welcome};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};

/// Receive buffer: big enough to take many small replies per syscall; large
/// payloads bypass it and go straight into the caller's buffer.
const RECV_BUF_BYTES: usize = 256 << 10;

pub struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    out: Vec<u8>,
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    scratch: Vec<u8>,
    next_tag: u32,
    next_seq: u64,
    spin: std::time::Duration,
    pub max_batch_pages: u32,
    pub max_inflight: u32,
    pub session_id: u64,
    pub lend_pages: u64,
}

impl Conn {
    /// Connect and authenticate. Every wait is bounded by the config.
    pub fn connect(addr: SocketAddr, cfg: &ClientConfig) -> Result<Conn, ClientError> {
        let stream = TcpStream::connect_timeout(&addr, cfg.connect_timeout)?;
        stream.set_nodelay(true)?;
        memlend_net::set_liveness(&stream, &memlend_net::Liveness::default())?;
        stream.set_read_timeout(Some(cfg.io_timeout))?;
        stream.set_write_timeout(Some(cfg.io_timeout))?;
        let mut conn = Conn {
            stream,
            peer: addr,
            out: Vec::with_capacity(64 << 10),
            rbuf: vec![0; RECV_BUF_BYTES],
            rstart: 0,
            rend: 0,
            scratch: Vec::new(),
            next_tag: 0,
            next_seq: 1,
            spin: cfg.spin_before_sleep,
            max_batch_pages: 0,
            max_inflight: 0,
            session_id: 0,
            lend_pages: 0,
        };
        conn.handshake(cfg)?;
        Ok(conn)
    }

    /// A second handle on the socket, for tests that speak raw frames.
    pub fn try_clone_stream(&self) -> io::Result<TcpStream> {
        self.stream.try_clone()
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn handshake(&mut self, cfg: &ClientConfig) -> Result<(), ClientError> {
        let mut client_nonce = [0u8; page::NONCE_LEN];
        getrandom::getrandom(&mut client_nonce).expect("the kernel's random source is available");
        let hello = Hello {
            version_min: page::VERSION,
            version_max: page::VERSION,
            borrower_id: cfg.borrower_id,
            client_nonce,
            resume_session: 0,
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
            (Some(k), false) => page::client_mac(k, &client_nonce, &ch.server_nonce, id, 0),
            _ => [0; page::MAC_LEN],
        };
        self.stream.write_all(&Auth { mac }.encode())?;
        self.stream.read_exact(&mut buf)?;
        let w = Welcome::decode(&buf)?;
        if w.status != Status::Ok {
            return Err(ClientError::Refused(w.status));
        }
        if let (Some(k), false) = (&cfg.key, ch.insecure) {
            let expected = page::server_mac(k, &client_nonce, &ch.server_nonce, id, w.session_id);
            if !page::verify_mac(&expected, &w.mac) {
                return Err(ClientError::ServerAuth);
            }
        }
        if w.max_batch_pages == 0 || w.max_inflight == 0 {
            return Err(ClientError::Protocol("donor offered zero limits".into()));
        }
        self.max_batch_pages = w.max_batch_pages.min(page::limits::MAX_BATCH_PAGES);
        self.max_inflight = w.max_inflight.min(page::limits::MAX_INFLIGHT);
        self.session_id = w.session_id;
        self.lend_pages = w.lend_pages;
        Ok(())
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
        h.tag
    }

    /// Send everything queued, in one write where the kernel allows.
    pub fn send(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// The tag the next `queue` will use.
    pub fn next_tag(&self) -> u32 {
        self.next_tag
    }

    /// Receive one reply. `dest` says where its payload goes: a buffer of
    /// exactly `payload_len` bytes, or None for `scratch()`. A reply with a
    /// non-Ok status is returned as is; the caller decides.
    pub fn recv<'b>(
        &mut self,
        dest: impl FnOnce(&RepHeader) -> Option<&'b mut [u8]>,
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
            return Ok(h);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let buf: &mut [u8] = match dest(&h) {
            Some(b) if b.len() == len => b,
            Some(b) => {
                return Err(ClientError::Protocol(format!(
                    "reply payload is {len} bytes, expected {}",
                    b.len()
                )))
            }
            None => {
                scratch.resize(len, 0);
                &mut scratch[..]
            }
        };
        let read = self.read_buffered(buf);
        let crc_ok = read.is_ok() && page::payload_crc(buf) == h.payload_crc;
        self.scratch = scratch;
        read?;
        if !crc_ok {
            return Err(ClientError::Status(Status::BadPayloadCrc));
        }
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

    /// Queue, send and receive one request (no pipelining).
    pub fn call(
        &mut self,
        h: ReqHeader,
        payload: &[&[u8]],
        dest: Option<&mut [u8]>,
    ) -> Result<RepHeader, ClientError> {
        let tag = self.queue(h, payload);
        self.send()?;
        let r = self.recv(|_| dest)?;
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

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("peer", &self.peer).field("session", &self.session_id).finish()
    }
}
