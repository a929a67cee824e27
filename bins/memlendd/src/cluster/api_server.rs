//! The local API socket: one thread accepts, one thread per process reads
//! its lines and hands them to the control loop. Replies and events are
//! written by the control loop itself (it owns the engine).

use super::wake::Waker;
use memlend_pool::api::{self, Ask, Tell, CLIENTS_MAX};
use memlend_server::lifecycle::{poll_accept, Shutdown};
use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Duration;

/// What a process's connection asks of the control loop.
pub enum Cmd {
    Open { owner: u64, writer: UnixStream },
    Ask { owner: u64, ask: Ask },
    Closed { owner: u64 },
}

/// Bind the socket: only root and the daemon's group may use it (a lease
/// credential is a secret).
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use anyhow::Context;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
    }
    if path.exists() {
        // A live daemon answers; a stale socket from a crash does not.
        if UnixStream::connect(path).is_ok() {
            anyhow::bail!("another memlendd serves {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove stale {}", path.display()))?;
    }
    let l = UnixListener::bind(path).with_context(|| format!("cannot bind {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(l)
}

pub fn serve(
    listener: UnixListener,
    path: PathBuf,
    cmds: SyncSender<Cmd>,
    waker: Waker,
    shutdown: Shutdown,
) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut next_owner = 1u64;
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!(error = %e, "cannot serve the API socket");
        return;
    }
    let accept = || listener.accept().map(|(s, _)| s);
    poll_accept("api", &shutdown, accept, |stream| {
        if stream.set_nonblocking(false).is_err() {
            return;
        }
        if live.load(Ordering::Relaxed) >= CLIENTS_MAX {
            let mut s = stream;
            let _ =
                api::write_json(&mut s, &Tell::Error { message: "too many API clients".into() });
            return;
        }
        let owner = next_owner;
        next_owner += 1;
        let (cmds, waker, live) = (cmds.clone(), waker.clone(), Arc::clone(&live));
        live.fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new().name(format!("api-{owner}")).spawn(move || {
            client(owner, stream, &cmds, &waker);
            live.fetch_sub(1, Ordering::Relaxed);
        });
        if spawned.is_err() {
            tracing::warn!("cannot start an API client thread");
        }
    });
    let _ = std::fs::remove_file(path);
}

fn client(owner: u64, stream: UnixStream, cmds: &SyncSender<Cmd>, waker: &Waker) {
    let Ok(writer) = stream.try_clone() else { return };
    // A stuck process must not stall the control loop that writes to it.
    let _ = writer.set_write_timeout(Some(Duration::from_millis(200)));
    let send = |c: Cmd| {
        let ok = cmds.send(c).is_ok();
        waker.wake();
        ok
    };
    if !send(Cmd::Open { owner, writer }) {
        return;
    }
    let mut reader = BufReader::new(stream);
    loop {
        let line = match api::read_line(&mut reader) {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(owner, error = %e, "API client dropped");
                break;
            }
        };
        match serde_json::from_str::<Ask>(&line) {
            Ok(ask) => {
                if !send(Cmd::Ask { owner, ask }) {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(owner, error = %e, "bad API line; closing");
                break;
            }
        }
    }
    send(Cmd::Closed { owner });
}
