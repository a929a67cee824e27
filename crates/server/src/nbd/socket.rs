//! The client's socket, TCP or Unix: what the handshake, TLS and
//! transmission need of it, so that one code path serves both listeners.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

pub(crate) trait Socket: AsFd + AsRawFd + Send + Sync + Sized + 'static {
    fn read_bytes(&self, buf: &mut [u8]) -> io::Result<usize>;
    fn write_bytes(&self, buf: &[u8]) -> io::Result<usize>;
    fn flush_bytes(&self) -> io::Result<()>;
    /// Read and write timeouts alike; None: wait forever.
    fn set_timeouts(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn set_nonblocking(&self, on: bool) -> io::Result<()>;
    fn try_clone(&self) -> io::Result<Self>;
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;
}

macro_rules! socket {
    ($t:ty) => {
        impl Socket for $t {
            fn read_bytes(&self, buf: &mut [u8]) -> io::Result<usize> {
                (&mut &*self).read(buf)
            }

            fn write_bytes(&self, buf: &[u8]) -> io::Result<usize> {
                (&mut &*self).write(buf)
            }

            fn flush_bytes(&self) -> io::Result<()> {
                (&mut &*self).flush()
            }

            fn set_timeouts(&self, timeout: Option<Duration>) -> io::Result<()> {
                self.set_read_timeout(timeout)?;
                self.set_write_timeout(timeout)
            }

            fn set_nonblocking(&self, on: bool) -> io::Result<()> {
                <$t>::set_nonblocking(self, on)
            }

            fn try_clone(&self) -> io::Result<Self> {
                <$t>::try_clone(self)
            }

            fn shutdown(&self, how: Shutdown) -> io::Result<()> {
                <$t>::shutdown(self, how)
            }
        }
    };
}

socket!(TcpStream);
socket!(UnixStream);

/// `Read` and `Write` over a shared socket.
pub(crate) struct SocketIo<'a, S: Socket>(pub &'a S);

impl<S: Socket> Read for SocketIo<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_bytes(buf)
    }
}

impl<S: Socket> Write for SocketIo<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_bytes(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush_bytes()
    }
}
