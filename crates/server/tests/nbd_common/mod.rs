//! Shared by the `nbd_*` integration tests: an in-process server on an
//! ephemeral port, a raw NBD client built on the wire codec, a well-behaved
//! "bystander" client, a slow store, and checks for the external tools.
#![allow(dead_code)] // each test file uses a different part

use memlend_server::lifecycle::Shutdown;
use memlend_server::nbd::{serve, serve_all, Export, Listener, NbdConfig};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, ReadOp, StoreInfo, StoreResult, WriteOp, PAGE_SIZE};
use memlend_wire::nbd::*;
use std::io::{self, Read, Write};
use std::net::{Shutdown as NetShutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Command as Proc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("memlend_server=debug")
        .try_init();
}

/// Fail (never skip) when an external client is missing.
pub fn require_tool(tool: &str, apt_package: &str) {
    if let Err(e) = Proc::new(tool).arg("--version").output() {
        panic!(
            "`{tool}` is needed by this test but cannot run ({e}): apt-get install {apt_package}"
        );
    }
}

pub fn ram(pages: u64) -> Arc<RamStore> {
    Arc::new(RamStore::new(pages, RamOptions::default()).unwrap())
}

/// The server, run on its own thread until dropped.
pub struct TestServer {
    pub port: u16,
    pub shutdown: Shutdown,
    pub stores: Vec<Arc<dyn PageStore>>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl TestServer {
    /// One RAM export of `pages` pages named "mem" (also the default).
    pub fn ram(pages: u64) -> Self {
        Self::start(vec![Export::new("mem", ram(pages))], NbdConfig::default())
    }

    pub fn start(exports: Vec<Export>, cfg: NbdConfig) -> Self {
        init_logs();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shutdown = Shutdown::new();
        let stores = exports.iter().map(|e| Arc::clone(&e.store)).collect();
        let stop = shutdown.clone();
        let thread = thread::spawn(move || serve(listener, exports, cfg, stop));
        TestServer { port, shutdown, stores, thread: Some(thread) }
    }

    /// `start`, and the same exports on a Unix socket at `socket` too.
    pub fn start_with_unix(exports: Vec<Export>, cfg: NbdConfig, socket: &Path) -> Self {
        init_logs();
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        let unix = UnixListener::bind(socket).unwrap();
        let shutdown = Shutdown::new();
        let stores = exports.iter().map(|e| Arc::clone(&e.store)).collect();
        let stop = shutdown.clone();
        let listeners = vec![Listener::Tcp(tcp), Listener::Unix(unix)];
        let thread = thread::spawn(move || serve_all(listeners, exports, cfg, stop));
        TestServer { port, shutdown, stores, thread: Some(thread) }
    }

    pub fn uri(&self, name: &str) -> String {
        format!("nbd://127.0.0.1:{}/{}", self.port, name)
    }

    /// Bytes of export `i` read straight from its store, bypassing NBD.
    pub fn store_bytes(&self, i: usize, offset: u64, len: usize) -> Vec<u8> {
        let first = offset / PAGE_SIZE as u64;
        let end = (offset + len as u64).div_ceil(PAGE_SIZE as u64);
        let mut buf = vec![0u8; (end - first) as usize * PAGE_SIZE];
        self.stores[i].read(&mut [ReadOp { page: first, buf: &mut buf }]).unwrap();
        let at = (offset % PAGE_SIZE as u64) as usize;
        buf[at..at + len].to_vec()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.stop();
        if let Some(t) = self.thread.take() {
            let r = t.join().expect("nbd server thread panicked");
            if !thread::panicking() {
                r.expect("nbd server returned an error");
            }
        }
    }
}

/// A reply as the raw client saw it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reply {
    pub cookie: u64,
    /// 0 or the NBD error value.
    pub error: u32,
    pub data: Vec<u8>,
}

/// A minimal NBD client: fixed newstyle, NO_ZEROES, optional structured
/// replies, `OPT_GO` with a block-size request.
pub struct RawClient {
    pub s: TcpStream,
    pub size: u64,
    pub flags: u16,
    pub structured: bool,
    next_cookie: u64,
}

pub fn read_exact_vec(s: &mut impl Read, n: usize) -> io::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Connect and read the greeting; return the stream ready for client flags.
pub fn connect_raw(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let g = Greeting::decode(&read_exact_vec(&mut s, GREETING_LEN).unwrap()).unwrap();
    assert_eq!(g.handshake_flags, handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES);
    s
}

pub fn send_option(s: &mut TcpStream, option: u32, data: &[u8]) {
    s.write_all(&OptHeader { option, len: data.len() as u32 }.encode()).unwrap();
    s.write_all(data).unwrap();
}

pub fn read_opt_reply(s: &mut TcpStream) -> io::Result<(OptReplyHeader, Vec<u8>)> {
    let h = OptReplyHeader::decode(&read_exact_vec(s, OPT_REPLY_HEADER_LEN)?).unwrap();
    let data = read_exact_vec(s, h.len as usize)?;
    Ok((h, data))
}

/// True if the peer closes `s` (EOF or reset) within a few seconds,
/// ignoring whatever it sends first.
pub fn closes_soon(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sink = [0u8; 4096];
    for _ in 0..100_000 {
        match s.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
    false
}

impl RawClient {
    pub fn connect(port: u16, name: &str, structured: bool) -> Self {
        let mut s = connect_raw(port);
        s.write_all(&ClientFlags { fixed_newstyle: true, no_zeroes: true }.encode()).unwrap();
        if structured {
            send_option(&mut s, opt::STRUCTURED_REPLY, &[]);
            let (h, _) = read_opt_reply(&mut s).unwrap();
            assert_eq!(h.reply, rep::ACK);
        }
        let (size, flags) = go(&mut s, name).expect("OPT_GO refused");
        RawClient { s, size, flags, structured, next_cookie: 1 }
    }

    /// A client over a stream that negotiated some other way.
    pub fn from_parts(s: TcpStream, size: u64, flags: u16, structured: bool) -> Self {
        RawClient { s, size, flags, structured, next_cookie: 1 }
    }

    pub fn cookie(&mut self) -> u64 {
        self.next_cookie += 1;
        self.next_cookie
    }

    pub fn send(&mut self, req: Request, payload: &[u8]) {
        let mut wire = req.encode().to_vec();
        wire.extend_from_slice(payload);
        self.s.write_all(&wire).unwrap();
    }

    /// Read one whole reply; `read_len` is the data a successful simple
    /// READ reply carries (simple replies do not say).
    /// With structured replies the server may still answer non-READ
    /// commands with simple replies, so the magic decides.
    pub fn recv(&mut self, read_len: usize) -> io::Result<Reply> {
        let magic = read_exact_vec(&mut self.s, 4)?;
        if magic == STRUCTURED_REPLY_MAGIC.to_be_bytes() {
            assert!(self.structured, "structured chunk without negotiation");
            return recv_structured(&mut self.s, magic);
        }
        let mut head = magic;
        head.extend(read_exact_vec(&mut self.s, SIMPLE_REPLY_LEN - 4)?);
        let r = SimpleReply::decode(&head).unwrap();
        let data = if r.error == 0 { read_exact_vec(&mut self.s, read_len)? } else { Vec::new() };
        Ok(Reply { cookie: r.cookie, error: r.error, data })
    }

    pub fn call(
        &mut self,
        cmd: Command,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> Reply {
        let cookie = self.cookie();
        self.send(Request { flags, kind: cmd as u16, cookie, offset, len }, payload);
        let read_len = if cmd == Command::Read { len as usize } else { 0 };
        let r = self.recv(read_len).expect("reply");
        assert_eq!(r.cookie, cookie, "reply for another request");
        r
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.call(Command::Write, 0, offset, data.len() as u32, data).error
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        let r = self.call(Command::Read, 0, offset, len, &[]);
        if r.error == 0 {
            Ok(r.data)
        } else {
            Err(r.error)
        }
    }

    /// A structured client that selected `base:allocation` for `name`.
    pub fn with_block_status(port: u16, name: &str) -> Self {
        let mut s = connect_raw(port);
        s.write_all(&ClientFlags { fixed_newstyle: true, no_zeroes: true }.encode()).unwrap();
        send_option(&mut s, opt::STRUCTURED_REPLY, &[]);
        assert_eq!(read_opt_reply(&mut s).unwrap().0.reply, rep::ACK);
        let contexts = meta_context(&mut s, opt::SET_META_CONTEXT, name, &[BASE_ALLOCATION]);
        assert_eq!(contexts, Ok(vec![(1, BASE_ALLOCATION.to_string())]));
        let (size, flags) = go(&mut s, name).expect("OPT_GO refused");
        RawClient { s, size, flags, structured: true, next_cookie: 1 }
    }

    /// BLOCK_STATUS: the extents of the one reply chunk, or the error.
    pub fn block_status(&mut self, flags: u16, offset: u64, len: u32) -> Result<Vec<Extent>, u32> {
        let r = self.call(Command::BlockStatus, flags, offset, len, &[]);
        if r.error != 0 {
            return Err(r.error);
        }
        let (id, extents) = decode_block_status(&r.data).expect("a block status chunk");
        assert_eq!(id, 1, "extents for a context that was not selected");
        Ok(extents)
    }

    pub fn disconnect(mut self) {
        let cookie = self.cookie();
        self.send(Request::new(Command::Disc, cookie, 0, 0), &[]);
        assert!(closes_soon(&mut self.s), "server kept the connection after DISC");
    }
}

/// OPT_GO for `name`; Ok((size, flags)) or Err(reply type).
pub fn go(s: &mut TcpStream, name: &str) -> Result<(u64, u16), u32> {
    let req = InfoRequest { name: name.as_bytes(), requests: vec![info::BLOCK_SIZE] };
    send_option(s, opt::GO, &req.encode());
    let mut export = None;
    for _ in 0..16 {
        let (h, data) = read_opt_reply(s).unwrap();
        match h.reply {
            rep::INFO => {
                if let Info::Export { size_bytes, flags } = Info::decode(&data).unwrap() {
                    export = Some((size_bytes, flags));
                }
            }
            rep::ACK => return Ok(export.expect("ACK without INFO_EXPORT")),
            err => return Err(err),
        }
    }
    panic!("too many option replies");
}

/// LIST or SET_META_CONTEXT for export `name`: the (id, name) of every
/// context in the answer, or the error reply type.
pub fn meta_context(
    s: &mut TcpStream,
    option: u32,
    name: &str,
    queries: &[&str],
) -> Result<Vec<(u32, String)>, u32> {
    let queries = queries.iter().map(|q| q.as_bytes()).collect();
    send_option(s, option, &MetaContextRequest { name: name.as_bytes(), queries }.encode());
    let mut contexts = Vec::new();
    for _ in 0..16 {
        let (h, data) = read_opt_reply(s).unwrap();
        assert_eq!(h.option, option);
        match h.reply {
            rep::META_CONTEXT => {
                let (id, name) = decode_rep_meta_context(&data).unwrap();
                contexts.push((id, String::from_utf8(name.to_vec()).unwrap()));
            }
            rep::ACK => return Ok(contexts),
            err => {
                assert!(!data.is_empty(), "error replies carry a message");
                return Err(err);
            }
        }
    }
    panic!("too many option replies");
}

/// The rest of a structured reply whose first 4 bytes (`magic`) are read.
fn recv_structured(s: &mut TcpStream, mut magic: Vec<u8>) -> io::Result<Reply> {
    let mut reply = Reply::default();
    let mut base = None;
    for _ in 0..1024 {
        let mut head = std::mem::take(&mut magic);
        let have = head.len();
        head.extend(read_exact_vec(s, CHUNK_HEADER_LEN - have)?);
        let h = ChunkHeader::decode(&head).unwrap();
        let payload = read_exact_vec(s, h.len as usize)?;
        reply.cookie = h.cookie;
        match h.kind {
            chunk_type::OFFSET_DATA => {
                let (offset, data) = decode_offset_data(&payload).unwrap();
                assert!(base.is_none(), "this server sends one data chunk per read");
                base = Some(offset);
                reply.data = data.to_vec();
            }
            chunk_type::NONE => assert!(payload.is_empty()),
            // Kept whole; `RawClient::block_status` decodes it.
            chunk_type::BLOCK_STATUS => reply.data = payload,
            k if k & chunk_type::FLAG_ERROR != 0 => {
                reply.error = decode_error_chunk(&payload).unwrap().0
            }
            k => panic!("unexpected chunk type {k}"),
        }
        if h.is_done() {
            return Ok(reply);
        }
        magic = read_exact_vec(s, 4)?;
    }
    panic!("reply never finished");
}

/// A well-behaved client that keeps writing and checking its own region on
/// one connection for the whole test, to show that abuse elsewhere does not
/// reach it.
pub struct Bystander {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Bystander {
    pub fn start(port: u16, offset: u64, len: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let mut c = RawClient::connect(port, "", true);
        let thread = thread::spawn(move || {
            let mut rounds = 0u64;
            while !flag.load(Ordering::Relaxed) || rounds == 0 {
                let data: Vec<u8> = (0..len).map(|i| (i as u64 * 31 + rounds * 7) as u8).collect();
                assert_eq!(c.write(offset, &data), 0, "bystander write failed");
                assert_eq!(c.read(offset, len).unwrap(), data, "bystander read back other bytes");
                rounds += 1;
                thread::sleep(Duration::from_millis(2));
            }
            c.disconnect();
            rounds
        });
        Bystander { stop, thread }
    }

    /// Stop and return how many verified rounds it made.
    pub fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("bystander failed")
    }
}

/// A RAM store that calls itself slow (so the server uses its worker pool)
/// and whose flush takes `flush_delay`.
pub struct SlowStore {
    pub inner: RamStore,
    pub flush_delay: Duration,
}

impl PageStore for SlowStore {
    fn info(&self) -> StoreInfo {
        let mut i = self.inner.info();
        i.caps.fast = false;
        i.caps.durable = true;
        i.name = "slow(ram)".into();
        i
    }
    fn read(&self, ops: &mut [ReadOp<'_>]) -> StoreResult<()> {
        self.inner.read(ops)
    }
    fn write(&self, ops: &[WriteOp<'_>]) -> StoreResult<()> {
        self.inner.write(ops)
    }
    fn discard(&self, page: u64, count: u64) -> StoreResult<()> {
        self.inner.discard(page, count)
    }
    fn flush(&self) -> StoreResult<()> {
        thread::sleep(self.flush_delay);
        Ok(())
    }
}

pub fn slow_store(pages: u64, flush_delay: Duration) -> Arc<SlowStore> {
    Arc::new(SlowStore { inner: RamStore::new(pages, RamOptions::default()).unwrap(), flush_delay })
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn shutdown_write(s: &TcpStream) {
    let _ = s.shutdown(NetShutdown::Write);
}
