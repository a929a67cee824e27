//! Transmission over TLS: one thread relays between the TLS session on the
//! client's socket and the plain end of a socket pair, whose other end the
//! ordinary transmission code serves as it serves a TCP socket. A rustls
//! session needs one owner, and the worker pool writes replies from
//! several threads; the relay keeps that code unchanged at the price of a
//! copy each way.

use super::socket::{Socket, SocketIo};
use rustls::ServerConnection;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// Decrypted bytes held for a slow plain side before the relay stops
/// reading the client.
const PENDING_PLAIN_BYTES_MAX: usize = 1 << 20;
/// Bytes read from the plain side at a time, and so encrypted at once.
const CHUNK_BYTES: usize = 64 << 10;
/// Encrypted bytes rustls may hold unsent; above one chunk's records.
const TLS_BUFFER_LIMIT_BYTES: usize = 1 << 20;
/// poll's timeout: nothing is waited for by time, this only bounds a
/// lost wakeup.
const POLL_TIMEOUT_MS: i32 = 1000;

struct Relay<S: Socket> {
    conn: ServerConnection,
    tcp: S,
    plain: UnixStream,
    /// Decrypted from the client, not yet taken by the plain side.
    to_plain: Vec<u8>,
    /// The client has sent its last byte (close_notify or end of stream).
    client_done: bool,
    /// The plain side has closed: the transmission is over.
    plain_done: bool,
    chunk: Box<[u8]>,
}

/// Relay until either side is done; the plain side ends when it closes
/// its end, the client with close_notify, end of stream or an error.
pub(crate) fn relay<S: Socket>(
    conn: ServerConnection,
    tcp: S,
    plain: UnixStream,
) -> io::Result<()> {
    tcp.set_nonblocking(true)?;
    plain.set_nonblocking(true)?;
    let mut r = Relay {
        conn,
        tcp,
        plain,
        to_plain: Vec::new(),
        client_done: false,
        plain_done: false,
        chunk: vec![0; CHUNK_BYTES].into_boxed_slice(),
    };
    r.conn.set_buffer_limit(Some(TLS_BUFFER_LIMIT_BYTES));
    let result = r.run();
    // Whatever ended it, both sides see the end.
    let _ = r.plain.shutdown(Shutdown::Both);
    let _ = r.tcp.shutdown(Shutdown::Both);
    result
}

impl<S: Socket> Relay<S> {
    /// Each pass moves bytes or sleeps in poll until one side is ready.
    fn run(&mut self) -> io::Result<()> {
        loop {
            self.decrypted_to_plain()?;
            if self.client_done && self.to_plain.is_empty() {
                return Ok(());
            }
            self.flush_tls()?;
            if self.plain_done && !self.conn.wants_write() {
                return Ok(());
            }
            let (tcp_ready, plain_ready) = self.wait()?;
            if tcp_ready && self.wants_client() {
                self.read_client()?;
            }
            if plain_ready && self.wants_plain() {
                self.read_plain()?;
            }
        }
    }

    fn wants_client(&self) -> bool {
        !self.client_done && self.to_plain.len() < PENDING_PLAIN_BYTES_MAX
    }

    /// Read the plain side only once the last chunk's records are sent, so
    /// what rustls holds stays within its buffer limit.
    fn wants_plain(&self) -> bool {
        !self.plain_done && !self.conn.wants_write()
    }

    /// Take what rustls has decrypted and hand it on as far as the plain
    /// side takes it without blocking.
    fn decrypted_to_plain(&mut self) -> io::Result<()> {
        while self.to_plain.len() < PENDING_PLAIN_BYTES_MAX {
            match self.conn.reader().read(&mut self.chunk) {
                Ok(0) => {
                    self.client_done = true;
                    break;
                }
                Ok(n) => self.to_plain.extend_from_slice(&self.chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        while !self.to_plain.is_empty() {
            match (&self.plain).write(&self.to_plain) {
                Ok(n) => drop(self.to_plain.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Send what rustls holds encrypted, as far as the socket takes it.
    fn flush_tls(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut SocketIo(&self.tcp)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn read_client(&mut self) -> io::Result<()> {
        match self.conn.read_tls(&mut SocketIo(&self.tcp)) {
            Ok(0) => self.client_done = true,
            Ok(_) => {
                if let Err(e) = self.conn.process_new_packets() {
                    // Send the alert rustls queued, then give up.
                    let _ = self.conn.write_tls(&mut SocketIo(&self.tcp));
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn read_plain(&mut self) -> io::Result<()> {
        match (&self.plain).read(&mut self.chunk) {
            Ok(0) => {
                self.plain_done = true;
                self.conn.send_close_notify();
            }
            Ok(n) => self.conn.writer().write_all(&self.chunk[..n])?,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Sleep until a side this relay waits on is ready: (client, plain).
    fn wait(&self) -> io::Result<(bool, bool)> {
        let interest = |read: bool, write: bool| {
            (if read { libc::POLLIN } else { 0 }) | (if write { libc::POLLOUT } else { 0 })
        };
        let mut fds = [
            libc::pollfd {
                fd: self.tcp.as_raw_fd(),
                events: interest(self.wants_client(), self.conn.wants_write()),
                revents: 0,
            },
            libc::pollfd {
                fd: self.plain.as_raw_fd(),
                events: interest(self.wants_plain(), !self.to_plain.is_empty()),
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfd for the whole call,
        // and both descriptors belong to sockets this relay owns.
        let rc =
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_TIMEOUT_MS) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok((false, false))
            } else {
                Err(e)
            };
        }
        // Errors and hang-ups count as ready: the next read reports them.
        let ready = |p: &libc::pollfd| p.revents != 0;
        Ok((ready(&fds[0]), ready(&fds[1])))
    }
}
