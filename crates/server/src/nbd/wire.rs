//! The byte stream a connection is served over in transmission: the
//! client's TCP socket; with TLS on a fast store the TLS session itself
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

macro_rules! socket_wire {
    ($t:ty, $spin:expr) => {
        impl Wire for $t {
            const SPIN: bool = $spin;

            fn read_some(&self, buf: &mut [u8]) -> io::Result<usize> {
                (&mut &*self).read(buf)
            }

            fn read_nowait(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
                memlend_net::recv_nowait(self, buf)
            }

            fn read_full(&self, buf: &mut [u8]) -> io::Result<usize> {
                memlend_net::recv_waitall(self, buf)
            }

            fn write_all_bytes(&self, buf: &[u8]) -> io::Result<()> {
                (&mut &*self).write_all(buf)
            }

            fn shutdown_both(&self) {
                let _ = self.shutdown(Shutdown::Both);
            }
        }
    };
}

socket_wire!(TcpStream, true);
socket_wire!(UnixStream, false);

/// A `Read` over a shared `Wire`.
pub(crate) struct WireReader<'a, W: Wire>(pub &'a W);

impl<W: Wire> Read for WireReader<'_, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_some(buf)
    }
}
