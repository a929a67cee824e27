use crate::args::{Args, ExportArg};
use crate::nbd_unix::{self, SocketFile};
use anyhow::{bail, Context, Result};
use memlend_host::meminfo;
use memlend_node::{keyfile, size::human};
use memlend_server::lifecycle::Shutdown;
use memlend_server::nbd;
use memlend_server::page::{PageServer, PageServerConfig, Registry, SlabFactory};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::{PageStore, PAGE_SIZE};
use std::net::TcpListener;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// What `--spin-us auto` and `--nbd-spin-us auto` stand for where a wake
/// is dear (`memlend_net::spin_pays`).
const PAGE_SPIN_AUTO_US: u64 = 200;
const NBD_SPIN_AUTO_US: u64 = 50;

pub fn run(args: Args) -> Result<()> {
    // Before any listener binds: a SIGTERM sent as soon as a port answers
    // must find the handler, or the daemon dies without its clean stop.
    let signals = stop_signals()?;
    let lend_pages = lend_pages(&args)?;
    let lend_bytes = lend_pages * PAGE_SIZE as u64;
    if !args.cluster.enabled {
        meminfo::check_lend(lend_bytes, &meminfo::Memory::read()?)?;
    }
    if args.mlock {
        meminfo::check_mlock(lend_bytes)?;
    }
    let key = load_key(&args)?;
    if args.swap_safe {
        memlend_host::process::make_swap_safe()?;
        tracing::info!("swap-safe: all memory locked, PR_SET_IO_FLUSHER set");
    }
    let ram = RamOptions { prealloc: args.prealloc, mlock: args.mlock };
    let exports = nbd_exports(&args, lend_pages)?;
    let export_pages: u64 = exports.iter().map(|e| e.pages).sum();
    if export_pages > lend_pages {
        bail!(
            "the exports need {} but --lend is {}",
            human(export_pages * 4096),
            human(lend_bytes)
        );
    }
    let factory: SlabFactory = Arc::new(move |pages| {
        let s: Arc<dyn PageStore> = Arc::new(RamStore::new(pages, ram)?);
        Ok(s)
    });
    let slab_pages = lend_pages - export_pages;
    let registry = match args.cluster.enabled {
        true => Registry::leased(slab_pages, factory),
        false => Registry::new(slab_pages, factory),
    };
    let registry = match args.max_per_borrower {
        Some(cap) => registry.with_borrower_cap(cap),
        None => registry,
    };
    let cfg = PageServerConfig {
        key: key.clone(),
        connections_max: args.max_connections,
        orphan_grace: Duration::from_secs(args.orphan_grace_s),
        spin_before_sleep: page_spin(&args),
        spin_nice: args.spin_nice,
        ..PageServerConfig::default()
    };
    let server = PageServer::new(cfg, registry);
    let shutdown = Shutdown::new();
    let listener = TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let data_addr = listener.local_addr()?;
    tracing::info!(
        listen = %data_addr,
        lend = %human(lend_bytes),
        slabs = %human(slab_pages * 4096),
        cluster = args.cluster.enabled,
        mlock = args.mlock,
        prealloc = args.prealloc,
        "lending"
    );
    let mut threads = vec![spawn("page-accept", {
        let (server, shutdown) = (Arc::clone(&server), shutdown.clone());
        move || server.serve(listener, shutdown)
    })?];
    // Removes the NBD socket file when `run` returns, after the threads.
    let mut _nbd_socket = None;
    if !exports.is_empty() {
        let (thread, socket) = start_nbd(&exports, ram, &args, shutdown.clone())?;
        threads.push(thread);
        _nbd_socket = socket;
    }
    if args.cluster.enabled {
        let ip = args.cluster.advertise.unwrap_or(data_addr.ip());
        if ip.is_unspecified() {
            bail!("--listen {data_addr} is not an address peers can reach: give --advertise IP");
        }
        let advertised = std::net::SocketAddr::new(ip, data_addr.port());
        let raw_key = key.as_ref().map(|k| k.bytes());
        let cap = args.lend;
        threads.extend(crate::cluster::start(
            &args.cluster,
            cap,
            raw_key,
            Arc::clone(&server),
            advertised,
            shutdown.clone(),
        )?);
    }
    wait_for_signal(signals);
    tracing::info!("stopping");
    shutdown.stop();
    for t in threads {
        let _ = t.join();
    }
    let st = server.stats();
    tracing::info!(
        requests = st.requests.load(Relaxed),
        pages_read = st.pages_read.load(Relaxed),
        pages_written = st.pages_written.load(Relaxed),
        errors = st.errors.load(Relaxed),
        "stopped"
    );
    Ok(())
}

/// Without --cluster, --lend is the budget. With it, the budget is at most
/// --lend and otherwise the node's memory: the classifier decides how much
/// of it is really lent at any time.
fn lend_pages(args: &Args) -> Result<u64> {
    match (args.lend, args.cluster.enabled) {
        (Some(p), _) => Ok(p),
        (None, true) => Ok(meminfo::Memory::read()?.total_bytes / PAGE_SIZE as u64),
        (None, false) => bail!("give --lend SIZE (or --cluster, to lend what the node can spare)"),
    }
}

fn load_key(args: &Args) -> Result<Option<memlend_wire::page::Key>> {
    match (&args.key, args.insecure) {
        (Some(path), _) => Ok(Some(keyfile::load(path)?)),
        (None, true) => {
            tracing::warn!(
                "running INSECURE: no cluster key, any client may borrow and read pages"
            );
            Ok(None)
        }
        (None, false) => {
            bail!("give --key FILE (make one with `memlend keygen FILE`) or --insecure")
        }
    }
}

/// The exports to serve: none without an NBD listener.
/// The page connections' spin; `auto` logs what it measured and chose.
fn page_spin(args: &Args) -> Duration {
    let spin = args.spin_us.resolve(PAGE_SPIN_AUTO_US);
    if args.spin_us == memlend_net::SpinSetting::Auto {
        let wake_us = memlend_net::wake_cost().map(|c| c.as_secs_f64() * 1e6);
        tracing::info!(
            wake_us = ?wake_us.map(|w| (w * 10.0).round() / 10.0),
            dear_us = memlend_net::WAKE_DEAR.as_micros() as u64,
            spin_us = spin.as_micros() as u64,
            "page connections spin where a wake across cores is dear"
        );
    }
    spin
}

fn nbd_exports(args: &Args, lend_pages: u64) -> Result<Vec<ExportArg>> {
    if args.nbd.is_none() && args.nbd_unix.is_none() {
        if !args.exports.is_empty() || args.nbd_read_only {
            bail!("--export and --nbd-read-only need --nbd ADDR or --nbd-unix PATH");
        }
        return Ok(Vec::new());
    }
    let mut exports = args.exports.clone();
    if exports.is_empty() {
        exports.push(ExportArg { name: "memlend".into(), pages: lend_pages, read_only: false });
    }
    for e in &mut exports {
        e.read_only |= args.nbd_read_only;
    }
    Ok(exports)
}

fn spawn(
    name: &str,
    f: impl FnOnce() -> std::io::Result<()> + Send + 'static,
) -> Result<JoinHandle<()>> {
    let what = name.to_string();
    Ok(thread::Builder::new().name(name.into()).spawn(move || {
        if let Err(e) = f() {
            tracing::error!(service = %what, error = %e, "service failed");
        }
    })?)
}

/// SIGTERM and SIGINT, caught from now on and delivered to `wait_for_signal`.
fn stop_signals() -> Result<signal_hook::iterator::Signals> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    Ok(signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?)
}

/// Block until SIGTERM or SIGINT (one that came during start counts).
fn wait_for_signal(mut signals: signal_hook::iterator::Signals) {
    if let Some(sig) = signals.forever().next() {
        tracing::info!(signal = sig, "signal received");
    }
}

/// The NBD TLS configuration the flags name, loaded now so that a bad file
/// stops the daemon at start.
fn nbd_tls(args: &Args) -> Result<Option<nbd::Tls>> {
    let (Some(cert), Some(key)) = (&args.nbd_tls_cert, &args.nbd_tls_key) else {
        return Ok(None);
    };
    let ca = args.nbd_tls_client_ca.as_deref();
    Ok(Some(nbd::Tls::from_pem_files(cert, key, ca)?))
}

/// Serve the NBD exports, each a RAM store carved out of the lent budget,
/// on --nbd and --nbd-unix. The socket file goes when the returned guard
/// is dropped.
fn start_nbd(
    exports: &[ExportArg],
    ram: RamOptions,
    args: &Args,
    shutdown: Shutdown,
) -> Result<(JoinHandle<()>, Option<SocketFile>)> {
    let mut list = Vec::new();
    for e in exports {
        let store: Arc<dyn PageStore> = Arc::new(RamStore::new(e.pages, ram)?);
        let about = format!("memlend RAM export of {}", human(e.pages * PAGE_SIZE as u64));
        list.push(
            nbd::Export::new(e.name.clone(), store).description(about).read_only(e.read_only),
        );
    }
    let tls = nbd_tls(args)?;
    let clients_verified = tls.as_ref().is_some_and(|t| t.verifies_clients());
    let cfg = nbd::NbdConfig {
        connections_max: args.max_nbd_connections,
        spin_before_sleep_us: args.nbd_spin_us.resolve(NBD_SPIN_AUTO_US).as_micros() as u64,
        allow: args.nbd_allow.clone(),
        tls,
        ..Default::default()
    };
    let mut listeners = Vec::new();
    if let Some(addr) = args.nbd {
        if !addr.ip().is_loopback() && args.nbd_allow.is_empty() && !clients_verified {
            bail!("--nbd {addr} is off loopback and plain NBD has no authentication: name the clients with --nbd-allow CIDR, or require client certificates with --nbd-tls-client-ca");
        }
        let l = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
        tracing::info!(nbd = %l.local_addr()?, "serving NBD over TCP");
        listeners.push(nbd::Listener::Tcp(l));
    }
    let mut socket = None;
    if let Some(path) = &args.nbd_unix {
        let (l, file) = nbd_unix::bind(path)?;
        tracing::info!(nbd_unix = %path.display(), mode = format!("{:o}", nbd_unix::SOCKET_MODE),
            "serving NBD on a Unix socket (its file mode is the access control)");
        listeners.push(nbd::Listener::Unix(l));
        socket = Some(file);
    }
    let names: Vec<_> = exports.iter().map(|e| (e.name.as_str(), e.read_only)).collect();
    tracing::info!(exports = ?names, "NBD exports (name, read-only)");
    let thread = spawn("nbd", move || nbd::serve_all(listeners, list, cfg, shutdown))?;
    Ok((thread, socket))
}
