//! Accept loops, connection limits and clean shutdown, shared by both servers.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::{Shutdown as NetShutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// How often a blocked accept loop looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// A stop flag plus every live connection, so that stopping can unblock
/// threads sitting in `read`. Cloned freely; all clones share state.
#[derive(Clone, Default)]
pub struct Shutdown {
    inner: Arc<ShutdownInner>,
}

#[derive(Default)]
struct ShutdownInner {
    stopping: AtomicBool,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Tracked>>,
}

/// A tracked connection's socket, kept to shut it down on stop.
enum Tracked {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// A connection socket `Shutdown` can track.
trait TrackedSocket {
    fn tracked(&self) -> io::Result<Tracked>;
}

impl TrackedSocket for TcpStream {
    fn tracked(&self) -> io::Result<Tracked> {
        self.try_clone().map(Tracked::Tcp)
    }
}

impl TrackedSocket for UnixStream {
    fn tracked(&self) -> io::Result<Tracked> {
        self.try_clone().map(Tracked::Unix)
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::Acquire)
    }

    /// Stop accepting and shut every tracked connection down. Idempotent.
    pub fn stop(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        for (_, s) in self.inner.conns.lock().drain() {
            let _ = match s {
                Tracked::Tcp(s) => s.shutdown(NetShutdown::Both),
                Tracked::Unix(s) => s.shutdown(NetShutdown::Both),
            };
        }
    }

    /// Number of connections being served now.
    pub fn live_connections(&self) -> usize {
        self.inner.conns.lock().len()
    }

    fn track(&self, stream: &impl TrackedSocket, limit: usize) -> io::Result<Option<ConnGuard>> {
        let mut conns = self.inner.conns.lock();
        if conns.len() >= limit {
            return Ok(None);
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        conns.insert(id, stream.tracked()?);
        Ok(Some(ConnGuard { shutdown: self.clone(), id }))
    }
}

/// Removes a connection from the tracked set when its thread ends.
pub struct ConnGuard {
    shutdown: Shutdown,
    id: u64,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.shutdown.inner.conns.lock().remove(&self.id);
    }
}

/// Accept connections on `listener` until `shutdown` stops, at most
/// `connections_max` at once, each served by `serve` on its own thread.
/// A connection over the limit is closed at once with a logged reason.
pub fn accept_loop<F>(
    what: &'static str,
    listener: TcpListener,
    shutdown: Shutdown,
    connections_max: usize,
    serve: F,
) -> io::Result<()>
where
    F: Fn(TcpStream, SocketAddr) + Send + Sync + 'static,
{
    listener.set_nonblocking(true)?;
    let serve = Arc::new(serve);
    poll_accept(
        what,
        &shutdown,
        || listener.accept(),
        |(stream, peer)| {
            if stream.set_nonblocking(false).is_err() {
                return;
            }
            let _ = stream.set_nodelay(true);
            if let Err(e) = memlend_net::set_liveness(&stream, &memlend_net::Liveness::default()) {
                tracing::warn!(server = what, %peer, error = %e, "cannot set TCP keepalive");
            }
            let serve = Arc::clone(&serve);
            let label = peer.to_string();
            start_tracked(what, &shutdown, connections_max, stream, label, move |s| serve(s, peer));
        },
    );
    Ok(())
}

/// `accept_loop` for a Unix socket: the same limit and stop, no address
/// (clients are told apart by the connection number in thread names).
pub fn accept_loop_unix<F>(
    what: &'static str,
    listener: UnixListener,
    shutdown: Shutdown,
    connections_max: usize,
    serve: F,
) -> io::Result<()>
where
    F: Fn(UnixStream) + Send + Sync + 'static,
{
    listener.set_nonblocking(true)?;
    let serve = Arc::new(serve);
    let mut accepted = 0u64;
    poll_accept(
        what,
        &shutdown,
        || listener.accept(),
        |(stream, _)| {
            if stream.set_nonblocking(false).is_err() {
                return;
            }
            accepted += 1;
            let serve = Arc::clone(&serve);
            let label = format!("unix#{accepted}");
            start_tracked(what, &shutdown, connections_max, stream, label, move |s| serve(s));
        },
    );
    Ok(())
}

/// Track `stream` within `connections_max` and serve it on its own thread,
/// or close it with a logged reason.
fn start_tracked<S: TrackedSocket + Send + 'static>(
    what: &'static str,
    shutdown: &Shutdown,
    connections_max: usize,
    stream: S,
    label: String,
    serve: impl FnOnce(S) + Send + 'static,
) {
    let guard = match shutdown.track(&stream, connections_max) {
        Ok(Some(g)) => g,
        Ok(None) => {
            tracing::warn!(server = what, peer = %label, connections_max, "connection refused: limit reached");
            return;
        }
        Err(e) => {
            tracing::warn!(server = what, peer = %label, error = %e, "connection dropped");
            return;
        }
    };
    let spawned = thread::Builder::new().name(format!("{what}-{label}")).spawn(move || {
        let _guard = guard;
        serve(stream);
    });
    if let Err(e) = spawned {
        tracing::warn!(server = what, peer = %label, error = %e, "cannot start connection thread");
    }
}

/// Run `accept` (on a nonblocking listener) until `shutdown` stops, handing
/// each connection to `take`. A blocking accept would never see the stop:
/// the thread could not be joined and the daemon would hang on SIGTERM.
pub fn poll_accept<C>(
    what: &str,
    shutdown: &Shutdown,
    mut accept: impl FnMut() -> io::Result<C>,
    mut take: impl FnMut(C),
) {
    while !shutdown.is_stopping() {
        match accept() {
            Ok(c) => take(c),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(server = what, error = %e, "accept failed");
                thread::sleep(ACCEPT_POLL);
            }
        }
    }
}
