//! The byte stream a connection is served over in transmission: the
//! client's TCP or Unix socket; with TLS on a fast store the TLS session itself
//! (`tls_wire.rs`); with TLS on a slow store the plain end of a socket pair
//! whose other end `tls_pump.rs` relays through the TLS session.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;

/// A stream the reading thread and the reply writers share by reference.
pub(crate) trait Wire: Sync {
    /// Whether the reading thread may poll for input before sleeping. Not
    /// on the relayed end: its bytes come from the relay thread, which a
    /// spinning reader starves on two cores (fio 4 KiB random writes over
    /// two TLS connections: 12 K IOPS spinning).
    const SPIN: bool;

    /// One blocking read; Ok(0) at end of stream.
    fn read_some(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// A read that never blocks: None if nothing is there yet.
    fn read_nowait(&self, buf: &mut [u8]) -> io::Result<Option<usize>>;
    /// Block until `buf` is full or the stream ends; the bytes read.
    fn read_full(&self, buf: &mut [u8]) -> io::Result<usize>;
    fn write_all_bytes(&self, buf: &[u8]) -> io::Result<()>;
    /// End both directions, so the reading thread sees end of stream.
    fn shutdown_both(&self);
}

/// The plain end of the TLS relay's socket pair (`tls_pump.rs`).
pub(crate) struct Relayed(pub UnixStream);

macro_rules! socket_wire {
    ($t:ty, $spin:expr, |$w:ident| $sock:expr) => {
        impl Wire for $t {
            const SPIN: bool = $spin;

            fn read_some(&self, buf: &mut [u8]) -> io::Result<usize> {
                let $w = self;
                (&mut &*$sock).read(buf)
            }

            fn read_nowait(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
                let $w = self;
                memlend_net::recv_nowait($sock, buf)
            }

            fn read_full(&self, buf: &mut [u8]) -> io::Result<usize> {
                let $w = self;
                memlend_net::recv_waitall($sock, buf)
            }

            fn write_all_bytes(&self, buf: &[u8]) -> io::Result<()> {
                let $w = self;
                (&mut &*$sock).write_all(buf)
            }

            fn shutdown_both(&self) {
                let $w = self;
                let _ = $sock.shutdown(Shutdown::Both);
            }
        }
    };
}

socket_wire!(TcpStream, true, |s| s);
socket_wire!(UnixStream, true, |s| s);
socket_wire!(Relayed, false, |r| &r.0);

/// A `Read` over a shared `Wire`.
pub(crate) struct WireReader<'a, W: Wire>(pub &'a W);

impl<W: Wire> Read for WireReader<'_, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_some(buf)
    }
}
