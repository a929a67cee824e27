//! Pages on leases from the cluster (a `--pool` placement): ask the local
//! `memlendd` for memory, open one slab per lease (the lease's credential
//! is the borrower id), and join them end to end; the first segment is
//! leased now, each later one when writes reach half of the one before
//! (`lease::grow`).
//! Under `--redundancy mirror` each segment is two legs of leases on
//! different donors (`lease::mirrored`). Each
//! lease sits in a `Relocatable`, so when its donor reclaims it the pages
//! move (to another lease, or home) while the program runs: the region is
//! handed to its lease agent (`crate::lease`), which does that on its own
//! thread.

use crate::lease::grow::{first_bytes, layout, leasing_ahead, unleased_segment, Asks};
use crate::lease::mirrored::{donors_of, mirror};
use crate::lease::slabs::{leg_label, open_leg};
use crate::lease::{backed_by_ssd, channel, member, open_lease, spawn, Handoff, Member};
use crate::{Copies, Opened, Placement, Redundancy};
use anyhow::{bail, Result};
use memlend_pool::api::{Ask, Client, LeaseGrant, Tell};
use memlend_remote::ClientConfig;
use memlend_store::layer::{Concat, Mirror};
use memlend_store::{PageStore, PAGE_SIZE};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long to wait for the cluster to lend the whole region.
pub const WANT_TIMEOUT: Duration = Duration::from_secs(10);
/// The first pause before asking again for what the cluster could not lend.
const WANT_RETRY_FIRST: Duration = Duration::from_millis(250);
const WANT_RETRY_MAX: Duration = Duration::from_secs(2);

pub fn open(p: &Placement, api_path: &Path, pages: u64) -> Result<Opened> {
    let first_pages = first_bytes()? / PAGE_SIZE as u64;
    let sizes = layout(pages, first_pages);
    let mut client = Client::connect(api_path)?;
    let backed = p.redundancy == Redundancy::Ssd;
    let mirrored = p.redundancy == Redundancy::Mirror;
    let mut cfg = super::donors::client_config(p)?;
    if backed || mirrored {
        // A lease with another copy fails over instead of waiting.
        cfg = super::redundant::leg_config(cfg);
    }
    let (tx, events) = channel();
    let first = if mirrored {
        first_mirrored(&mut client, p, &cfg, sizes[0], tx.clone())?
    } else {
        first_plain(&mut client, p, &cfg, sizes[0])?
    };
    let like = first.store.info();
    let mut stores = vec![Arc::clone(&first.store)];
    for (i, &size) in sizes.iter().enumerate().skip(1) {
        stores.push(Arc::new(unleased_segment(i, size, like.clone(), tx.clone())));
    }
    // Each segment but the last leases the next one when half written.
    for (i, pair) in sizes.windows(2).enumerate() {
        let store = Arc::clone(&stores[i]);
        stores[i] = Arc::new(leasing_ahead(store, pair[0], i, pair[1], tx.clone()));
    }
    let store = Concat::new(stores)?;
    let mut describe = first.describe;
    if sizes.len() > 1 {
        let later = crate::human_pages(pages - sizes[0]);
        describe.push_str(&format!(", {later} more in {} leases as it fills", sizes.len() - 1));
    }
    let copies = Copies { mirrors: first.mirrors, ..Copies::default() };
    let handoff = Handoff {
        client,
        members: first.members,
        cfg,
        encrypt: p.encrypts(),
        home: p.ssd.clone(),
        backed,
        mirrored,
        segments: sizes.len(),
        copies: copies.clone(),
    };
    spawn(handoff, tx, events, Arc::clone(&first.store))?;
    Ok(Opened::new(Arc::new(store), pages, describe, copies))
}

/// The first segment, leased before the region opens.
struct First {
    store: Arc<dyn PageStore>,
    members: Vec<Member>,
    mirrors: Vec<Arc<Mirror>>,
    describe: String,
}

/// Leases for `pages` within [`WANT_TIMEOUT`], away from `avoid`, or an
/// error (and nothing held) when the cluster lends less.
fn want_all(client: &mut Client, pages: u64, avoid: &[u64]) -> Result<Vec<LeaseGrant>> {
    let grants = want(client, pages * PAGE_SIZE as u64, WANT_TIMEOUT, avoid)?;
    let got: u64 = grants.iter().map(|g| g.bytes).sum::<u64>() / PAGE_SIZE as u64;
    if got < pages {
        release(client, &grants);
        bail!(
            "the cluster lent {} of the {} asked in {} s: no donor has room now",
            crate::human_pages(got),
            crate::human_pages(pages),
            WANT_TIMEOUT.as_secs()
        );
    }
    Ok(grants)
}

fn release(client: &mut Client, grants: &[LeaseGrant]) {
    for g in grants {
        let _ = client.ask(&Ask::Release { donor: g.donor, lease: g.lease });
    }
}

fn first_plain(
    client: &mut Client,
    p: &Placement,
    cfg: &ClientConfig,
    pages: u64,
) -> Result<First> {
    let grants = want_all(client, pages, &[])?;
    let backed = p.redundancy == Redundancy::Ssd;
    let mut members = Vec::new();
    for g in &grants {
        let store = open_lease(g, cfg, p.encrypts())?;
        members.push(member(Some((g.donor, g.lease)), &g.donor_name, store, 0));
    }
    let mut mirrors = Vec::new();
    let mut first: Vec<Arc<dyn PageStore>> = Vec::new();
    let ssd_dir = p.ssd.clone().unwrap_or_else(crate::default_ssd_dir);
    for m in &members {
        let lease = Arc::clone(&m.stats) as Arc<dyn PageStore>;
        if !backed {
            first.push(lease);
            continue;
        }
        let mirror = Arc::new(backed_by_ssd(&ssd_dir, lease, &m.donor_name, m.pages)?);
        first.push(Arc::clone(&mirror) as Arc<dyn PageStore>);
        mirrors.push(mirror);
    }
    let store: Arc<dyn PageStore> = match first.len() {
        1 => first.pop().expect("one store"),
        _ => Arc::new(Concat::new(first)?),
    };
    let names: Vec<&str> = grants.iter().map(|g| g.donor_name.as_str()).collect();
    let mut describe = format!("{} lease(s) from {}", grants.len(), names.join(", "));
    if backed {
        describe.push_str(", each backed by an SSD file");
    }
    Ok(First { store, members, mirrors, describe })
}

/// Two legs of leases for the first segment, the second from other donors
/// (other failure domains when the cluster has them): `lease::mirrored`.
fn first_mirrored(
    client: &mut Client,
    p: &Placement,
    cfg: &ClientConfig,
    pages: u64,
    asks: Asks,
) -> Result<First> {
    let a_grants = want_all(client, pages, &[])?;
    let b_grants = match want_all(client, pages, &donors_of(&a_grants)) {
        Ok(g) => g,
        Err(e) => {
            release(client, &a_grants);
            let a = leg_label(&a_grants);
            return Err(e.context(format!("no donor apart from {a} for a mirror's second copy")));
        }
    };
    let legs = open_leg(&a_grants, 0, cfg, p.encrypts())
        .and_then(|a| Ok((a, open_leg(&b_grants, 0, cfg, p.encrypts())?)))
        .and_then(|(a, b)| Ok((mirror(&a, &b, pages, 0, asks)?, a, b)));
    let (m, a, b) = match legs {
        Ok(x) => x,
        Err(e) => {
            release(client, &a_grants);
            release(client, &b_grants);
            return Err(e);
        }
    };
    let describe = format!("mirrored on leases from {} and {}", a.label, b.label);
    let m = Arc::new(m);
    let members = a.members.into_iter().chain(b.members).collect();
    Ok(First { store: Arc::clone(&m) as Arc<dyn PageStore>, members, mirrors: vec![m], describe })
}

/// Ask for `bytes`; collect leases until they cover it or `timeout` passes.
/// An `Unmet` is not final: the cluster moves (a new server's heartbeat not
/// yet heard here, a donor between two samples), so the unmet part is asked
/// for again after a pause that doubles up to `WANT_RETRY_MAX`. Other lines
/// are returned to nobody: this runs before the reclaim thread exists.
pub fn want(
    client: &mut Client,
    bytes: u64,
    timeout: Duration,
    avoid: &[u64],
) -> Result<Vec<LeaseGrant>> {
    let ask = |bytes| Ask::Want { bytes, avoid: avoid.to_vec() };
    client.ask(&ask(bytes))?;
    let start = Instant::now();
    let mut grants = Vec::new();
    let mut got = 0;
    let mut pause = WANT_RETRY_FIRST;
    while got < bytes {
        let Some(left) = timeout.checked_sub(start.elapsed()) else { break };
        let tell = match client.next(Some(left.max(Duration::from_millis(1)))) {
            Err(e) if is_timeout(&e) => break,
            other => other?,
        };
        match tell {
            Some(Tell::Lease(g)) => {
                got += g.bytes;
                grants.push(g);
            }
            Some(Tell::Unmet { bytes: unmet }) => {
                if start.elapsed() + pause >= timeout {
                    break;
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(WANT_RETRY_MAX);
                client.ask(&ask(unmet))?;
            }
            Some(Tell::Error { message }) => bail!("memlendd: {message}"),
            Some(_) => {}
            None => bail!("memlendd closed the connection"),
        }
    }
    Ok(grants)
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// `$MEMLEND_POOL` or the daemon's default socket.
pub fn default_api_path() -> PathBuf {
    std::env::var_os(crate::env::POOL)
        .map(PathBuf::from)
        .unwrap_or_else(|| "/run/memlend/memlendd.sock".into())
}
