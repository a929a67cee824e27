//! The page server: memlend's own protocol, for borrowers.
//!
//! One thread per connection. After the handshake a connection is a loop of
//! "read what has arrived, serve it all inline, write all the replies".
//! Bad frames end that connection only, with a logged reason; slabs are per
//! borrower, so no connection can reach another borrower's pages.

mod conn;
mod handshake;
mod ops;
mod registry;
mod sessions;
mod stats;

pub use registry::{BorrowerId, Registry, SlabFactory};
pub use stats::ServerStats;

use crate::lifecycle::{accept_loop, Shutdown};
use memlend_wire::page::{limits, Key};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// Everything the page server needs to know; every limit is explicit.
#[derive(Clone, Debug)]
pub struct PageServerConfig {
    /// The cluster key; `None` runs insecure (any client is accepted).
    pub key: Option<Key>,
    pub connections_max: usize,
    pub batch_pages_max: u32,
    pub inflight_max: u32,
    /// A handshake must finish within this, so silent peers cannot hold
    /// connection slots.
    pub handshake_timeout: Duration,
    /// How long a borrower's slabs outlive its last connection.
    pub orphan_grace: Duration,
    /// Poll for the next request up to this long before sleeping in `read`
    /// (0: never), while recent requests came within it (`AdaptiveSpin`):
    /// waking a sleeping thread on an idle vCPU costs tens of µs here, more
    /// than serving a page.
    pub spin_before_sleep: Duration,
    /// The nice value a connection thread polls at (0: its own): the poll
    /// takes only CPU no other thread wants (`memlend_net::SpinNice`).
    pub spin_nice: i32,
}

impl Default for PageServerConfig {
    fn default() -> Self {
        PageServerConfig {
            key: None,
            connections_max: 256,
            batch_pages_max: limits::BATCH_PAGES_MAX,
            inflight_max: limits::INFLIGHT_MAX,
            handshake_timeout: Duration::from_secs(10),
            orphan_grace: Duration::from_secs(60),
            spin_before_sleep: Duration::from_micros(200),
            spin_nice: 0,
        }
    }
}

pub struct PageServer {
    cfg: PageServerConfig,
    registry: Registry,
    sessions: sessions::Sessions,
    stats: ServerStats,
}

/// Sessions kept per connection slot: room for every connection's session
/// plus as many waiting to be resumed.
const SESSIONS_PER_CONNECTION: usize = 2;

impl PageServer {
    pub fn new(cfg: PageServerConfig, registry: Registry) -> Arc<Self> {
        assert!(cfg.batch_pages_max >= 1 && cfg.batch_pages_max <= limits::BATCH_PAGES_MAX);
        assert!(cfg.inflight_max >= 1 && cfg.inflight_max <= limits::INFLIGHT_MAX);
        assert!(cfg.spin_before_sleep <= Duration::from_millis(10), "a longer spin burns a core");
        let sessions_max = cfg.connections_max * SESSIONS_PER_CONNECTION;
        let sessions = sessions::Sessions::new(sessions_max, cfg.inflight_max as usize);
        Arc::new(PageServer { cfg, registry, sessions, stats: ServerStats::default() })
    }

    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Serve `listener` until `shutdown` stops. Also runs the janitor that
    /// frees orphaned slabs.
    pub fn serve(self: &Arc<Self>, listener: TcpListener, shutdown: Shutdown) -> io::Result<()> {
        let janitor = {
            let (me, shutdown) = (Arc::clone(self), shutdown.clone());
            thread::Builder::new().name("page-janitor".into()).spawn(move || {
                while !shutdown.is_stopping() {
                    me.registry.reap_orphans(me.cfg.orphan_grace);
                    me.sessions.reap(me.cfg.orphan_grace);
                    thread::sleep(Duration::from_millis(200));
                }
            })?
        };
        let me = Arc::clone(self);
        let max = self.cfg.connections_max;
        let result = accept_loop("page", listener, shutdown, max, move |stream, peer| {
            me.serve_connection(stream, peer)
        });
        let _ = janitor.join();
        result
    }

    fn serve_connection(&self, mut stream: TcpStream, peer: SocketAddr) {
        self.stats.connections_total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let offer = handshake::Offer {
            batch_pages_max: self.cfg.batch_pages_max,
            inflight_max: self.cfg.inflight_max,
            lend_pages: self.registry.lend_pages(),
        };
        let _ = stream.set_read_timeout(Some(self.cfg.handshake_timeout));
        let key = self.cfg.key.as_ref();
        let session = match handshake::accept(&mut stream, key, &offer, &self.sessions) {
            Ok(s) => s,
            // A peer that connects and closes without a word is a probe
            // (a health check, a port scan): not worth a warning.
            Err(handshake::HandshakeError::Silent) => {
                tracing::debug!(%peer, "closed before HELLO");
                return;
            }
            Err(e) => {
                self.stats.handshakes_failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(%peer, reason = %e, "handshake refused");
                return;
            }
        };
        let _ = stream.set_read_timeout(None);
        let id = session.borrower_id;
        let (sid, resumed) = (session.session.id, session.resumed_seq);
        tracing::debug!(%peer, session = sid, resumed, "borrower connected");
        self.registry.attach(id);
        let (epoch, sess) = (session.epoch, Arc::clone(&session.session));
        let mut conn = conn::Conn::new(stream, &self.registry, session, &self.cfg, &self.stats);
        match conn.run() {
            Ok(()) => tracing::debug!(%peer, "borrower disconnected"),
            Err(e) => tracing::warn!(%peer, reason = %e, "connection closed"),
        }
        sess.detach(epoch);
        self.registry.detach(id);
    }
}
