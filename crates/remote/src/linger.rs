//! An exiting borrower tells its donors so. A donor keeps a borrower's slabs
//! for a grace period (60 s by default) after its last connection ends, so
//! that a borrower cut off for a moment finds its pages again. A process
//! that exits has no use for that: without a word from it, the next one
//! found the donor full for a minute. So every (donor, borrower id) this
//! process opened a slab with is remembered, and [`linger_all`] (called at
//! exit by the preload shim) asks each donor to free that borrower's slabs
//! as soon as its connections are gone. It changes nothing while they last.

use crate::{ClientConfig, Conn};
use memlend_wire::page::{Opcode, ReqHeader};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

/// Donors remembered at most; a process borrows from a handful.
const REMEMBERED_MAX: usize = 64;
/// Per donor, at exit: a donor that is down must not hold the exit up.
const EXIT_TIMEOUT: Duration = Duration::from_millis(250);

static BORROWED: Mutex<Vec<(SocketAddr, ClientConfig)>> = Mutex::new(Vec::new());

/// This process opened a slab on `addr` as `cfg.borrower_id`.
pub(crate) fn remember(addr: SocketAddr, cfg: &ClientConfig) {
    let mut borrowed = BORROWED.lock().unwrap_or_else(|e| e.into_inner());
    let known = borrowed.iter().any(|(a, c)| *a == addr && c.borrower_id == cfg.borrower_id);
    if !known && borrowed.len() < REMEMBERED_MAX {
        borrowed.push((addr, cfg.clone()));
    }
}

/// Ask every donor this process borrowed from to free its slabs within
/// `grace_s` seconds of its last connection ending (0: at once). Best
/// effort, at most `EXIT_TIMEOUT` per donor; returns how many agreed.
/// A donor too old to know the request keeps its own grace.
pub fn linger_all(grace_s: u32) -> usize {
    let borrowed = BORROWED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    borrowed.iter().filter(|(addr, cfg)| linger(*addr, cfg, grace_s)).count()
}

fn linger(addr: SocketAddr, cfg: &ClientConfig, grace_s: u32) -> bool {
    let cfg = ClientConfig {
        connect_timeout: EXIT_TIMEOUT,
        io_timeout: EXIT_TIMEOUT,
        retries_max: 0,
        ..cfg.clone()
    };
    let told = Conn::connect(addr, &cfg).and_then(|mut conn| {
        conn.call(ReqHeader { count: grace_s, ..ReqHeader::new(Opcode::Linger, 0) }, &[], None)
    });
    if let Err(e) = &told {
        tracing::debug!(%addr, error = %e, "could not tell the donor we are exiting");
    }
    told.is_ok()
}
