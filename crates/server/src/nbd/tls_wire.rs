//! Transmission over TLS for fast stores: the connection thread, the only
//! reader and the only writer there, owns the TLS session and serves
//! through it directly, with no relay thread (`tls_pump.rs` is kept for the
//! worker pool, whose threads write replies at once). The mutex is never
//! contended; it is there because `Wire` is shared by reference.

use super::socket::{Socket, SocketIo};
use super::wire::Wire;
use parking_lot::Mutex;
use rustls::ServerConnection;
use std::io::{self, Read, Write};
use std::net::Shutdown;

/// Plaintext encrypted and sent at a time.
const WRITE_CHUNK_BYTES: usize = 1 << 20;

pub(crate) struct TlsWire<S: Socket> {
    session: Mutex<Session<S>>,
    /// The same socket, to shut down without the session's lock.
    shut: S,
}

struct Session<S: Socket> {
    conn: ServerConnection,
    tcp: S,
}

/// A receive that never blocks, for `read_tls`.
struct NoWait<'a, S: Socket>(&'a S);

impl<S: Socket> Read for NoWait<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        memlend_net::recv_nowait(self.0, buf)?.ok_or_else(|| io::ErrorKind::WouldBlock.into())
    }
}

impl<S: Socket> TlsWire<S> {
    pub(crate) fn new(mut conn: ServerConnection, tcp: S) -> io::Result<TlsWire<S>> {
        let shut = tcp.try_clone()?;
        // Bounded by WRITE_CHUNK_BYTES instead: each chunk is sent before
        // the next is taken.
        conn.set_buffer_limit(None);
        Ok(TlsWire { session: Mutex::new(Session { conn, tcp }), shut })
    }

    /// Say goodbye with close_notify, as far as the socket takes it.
    pub(crate) fn close(&self) {
        let mut s = self.session.lock();
        s.conn.send_close_notify();
        let _ = s.flush();
    }
}

impl<S: Socket> Session<S> {
    /// Plaintext rustls already holds: None if it has none yet.
    fn plaintext(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self.conn.reader().read(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Feed rustls what the socket has (0: end of stream), waiting for it
    /// or not, and decrypt it.
    fn feed(&mut self, wait: bool) -> io::Result<usize> {
        let n = if wait {
            self.conn.read_tls(&mut SocketIo(&self.tcp))?
        } else {
            self.conn.read_tls(&mut NoWait(&self.tcp))?
        };
        if let Err(e) = self.conn.process_new_packets() {
            // Send the alert rustls queued, then give up.
            let _ = self.conn.write_tls(&mut SocketIo(&self.tcp));
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(&mut SocketIo(&self.tcp))?;
        }
        Ok(())
    }
}

impl<S: Socket> Wire for TlsWire<S> {
    const SPIN: bool = true;

    fn read_some(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = self.session.lock();
        // Each pass decrypts at least one more record, or ends.
        loop {
            if let Some(n) = s.plaintext(buf)? {
                return Ok(n);
            }
            if s.feed(true)? == 0 {
                return Ok(0);
            }
        }
    }

    fn read_nowait(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let mut s = self.session.lock();
        if let Some(n) = s.plaintext(buf)? {
            return Ok(Some(n));
        }
        match s.feed(false) {
            Ok(0) => Ok(Some(0)),
            Ok(_) => s.plaintext(buf),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn read_full(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        // Bounded by `buf`: each pass reads at least a byte, or ends.
        while got < buf.len() {
            match self.read_some(&mut buf[got..])? {
                0 => break,
                n => got += n,
            }
        }
        Ok(got)
    }

    fn write_all_bytes(&self, buf: &[u8]) -> io::Result<()> {
        let mut s = self.session.lock();
        // A chunk at a time, so that rustls holds at most one encrypted.
        for chunk in buf.chunks(WRITE_CHUNK_BYTES) {
            s.conn.writer().write_all(chunk)?;
            s.flush()?;
        }
        Ok(())
    }

    fn shutdown_both(&self) {
        let _ = self.shut.shutdown(Shutdown::Both);
    }
}
