//! Who a connection is, for the logs: a TCP address, or for the Unix
//! listener the connecting process's credentials (there is no address).

use std::fmt;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    Tcp(SocketAddr),
    /// SO_PEERCRED at connect time; None if the kernel would not say.
    Unix {
        pid: Option<i32>,
        uid: Option<u32>,
    },
}

impl Peer {
    pub fn of_unix(stream: &UnixStream) -> Peer {
        let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: `cred` and `len` are live locals sized for SO_PEERCRED's
        // ucred; the descriptor belongs to `stream` for the whole call.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        match rc {
            0 => Peer::Unix { pid: Some(cred.pid), uid: Some(cred.uid) },
            _ => Peer::Unix { pid: None, uid: None },
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Tcp(addr) => write!(f, "{addr}"),
            Peer::Unix { pid: Some(pid), uid: Some(uid) } => write!(f, "unix:pid={pid},uid={uid}"),
            Peer::Unix { .. } => write!(f, "unix"),
        }
    }
}
