//! `memlendd --cluster`: the ACMS control plane beside the page server. The
//! control loop (`control.rs`) owns the protocol engine; the API socket and
//! the metrics endpoint talk to it through channels. Control plane and data
//! plane meet only in the registry: a grant lets a credential open slabs,
//! the end of a lease frees them.

mod api_server;
mod control;
mod metrics_http;
mod sense;
mod status;
mod timeline;
mod transport;
mod wake;

use crate::args::ClusterArgs as Args;
use anyhow::{bail, Context, Result};
use memlend_pool::engine::{Config, Engine};
use memlend_server::lifecycle::Shutdown;
use memlend_server::page::PageServer;
use memlend_wire::ctrl::{CtrlKey, NodeId};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// Commands queued from API clients before their threads wait.
const CMD_QUEUE: usize = 1024;

pub fn start(
    args: &Args,
    lend_cap_pages: Option<u64>,
    key: Option<&[u8; 32]>,
    server: Arc<PageServer>,
    data_addr: SocketAddr,
    shutdown: Shutdown,
) -> Result<Vec<JoinHandle<()>>> {
    let name = node_name(args)?;
    let (ctrl_key, cluster_id) = match key {
        Some(k) => (CtrlKey::new(k), memlend_wire::ctrl::cluster_id_from_key(k)),
        None => (CtrlKey::insecure(), 0),
    };
    let node = node_id(&name);
    let incarnation =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    let sock = UdpSocket::bind(args.control)
        .with_context(|| format!("cannot bind the control socket {}", args.control))?;
    let transport =
        transport::Transport::new(sock, ctrl_key, cluster_id, node, incarnation, args.broadcast)?;
    let mut cfg = Config::new(node, &name, data_addr, random_secret()?);
    cfg.broadcast = args.broadcast.is_some();
    cfg.seeds = args.seeds.clone();
    cfg.reclaim_deadline_ms = args.reclaim_deadline_ms;
    cfg.domain = args.domain.clone().unwrap_or_default();
    if !cfg.broadcast && cfg.seeds.is_empty() {
        tracing::warn!("no --broadcast and no --seed: this node will only hear peers that find it");
    }
    let kind: memlend_pool::select::SelectorKind =
        args.selector.parse().map_err(anyhow::Error::msg)?;
    let thresholds: memlend_pool::classify::Thresholds = args.thresholds.parse()?;
    let selector = memlend_pool::select::make(kind);
    let sense = sense::Sense {
        source: memory_source(args)?,
        classifier: memlend_pool::classify::Classifier::new(thresholds, Default::default())?,
        cap_bytes: lend_cap_pages.map(|p| p * memlend_store::PAGE_SIZE as u64),
    };
    let (waker, wake_rx) = wake::pair()?;
    let (cmd_tx, cmd_rx) = sync_channel(CMD_QUEUE);
    let (snap_tx, snap_rx) = sync_channel(16);
    let listener = api_server::bind(&args.api)?;
    let timeline = match &args.timeline {
        Some(p) => Some(
            timeline::Timeline::create(p)
                .with_context(|| format!("cannot create {}", p.display()))?,
        ),
        None => None,
    };
    tracing::info!(%name, node, domain = %cfg.domain, control = %args.control, broadcast = ?args.broadcast, seeds = ?args.seeds, api = %args.api.display(), "joining the cluster");
    let control = control::Control {
        engine: Engine::new(cfg, selector),
        transport,
        sense,
        server,
        cmds: cmd_rx,
        snapshots: snap_rx,
        wake: wake_rx,
        timeline,
        shutdown: shutdown.clone(),
        clients: Default::default(),
        home_bytes: Default::default(),
        start: Instant::now(),
        next_sample_us: 0,
    };
    let mut threads = vec![spawn("control", move || control.run())?];
    let (api_path, w, stop) = (args.api.clone(), waker.clone(), shutdown.clone());
    threads
        .push(spawn("api-accept", move || api_server::serve(listener, api_path, cmd_tx, w, stop))?);
    if let Some(addr) = args.metrics {
        let l = TcpListener::bind(addr)
            .with_context(|| format!("cannot listen on {addr} for metrics"))?;
        threads.push(spawn("metrics", move || metrics_http::serve(l, snap_tx, waker, shutdown))?);
    }
    Ok(threads)
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    Ok(std::thread::Builder::new().name(name.into()).spawn(f)?)
}

fn node_name(args: &Args) -> Result<String> {
    let name = match &args.node {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")?.trim().to_string(),
    };
    if name.is_empty() || name.len() > memlend_wire::ctrl::NAME_BYTES_MAX {
        bail!("a node name is 1 to {} bytes: {name:?}", memlend_wire::ctrl::NAME_BYTES_MAX);
    }
    Ok(name)
}

/// Stable across restarts: the same name is the same node, one incarnation
/// later.
fn node_id(name: &str) -> NodeId {
    use sha2::Digest;
    let h = sha2::Sha256::digest(format!("memlend/v1/node/{name}").as_bytes());
    u64::from_le_bytes(h[..8].try_into().expect("8 bytes"))
}

fn random_secret() -> Result<[u8; 32]> {
    let mut s = [0u8; 32];
    getrandom::getrandom(&mut s).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(s)
}

fn memory_source(args: &Args) -> Result<memlend_pool::monitor::MemorySource> {
    use memlend_pool::monitor::MemorySource;
    Ok(match args.memory.as_str() {
        "host" => MemorySource::Host,
        "auto" => MemorySource::detect()?,
        path => MemorySource::cgroup(std::path::Path::new(path))?,
    })
}
