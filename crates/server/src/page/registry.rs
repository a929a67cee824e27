//! Who holds which slabs, and how much of the lent budget is promised.
//!
//! Slabs belong to a borrower id. A connection can only reach the slabs of the
//! borrower it authenticated as: slab ids are looked up in that borrower's own
//! table, so one borrower can never name another's slab. Slabs outlive a
//! dropped connection for a grace period, so a reconnecting borrower finds
//! its pages again; after that they are freed.

use memlend_store::layer::LocalTags;
use memlend_store::{PageStore, SidecarStore, StoreResult};
use memlend_wire::page::{limits, Status};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub type BorrowerId = [u8; 16];

/// Makes the store behind a new slab of the given number of pages.
pub type SlabFactory = Arc<dyn Fn(u64) -> StoreResult<Arc<dyn PageStore>> + Send + Sync>;

pub struct Slab {
    pub store: Arc<dyn PageStore>,
    /// The same store with a sidecar beside every page, for a slab opened
    /// sealed (`FLAG_SEALED`).
    pub sealed: Option<Arc<dyn SidecarStore>>,
    pub pages: u64,
    closed: AtomicBool,
}

impl Slab {
    /// False once the slab is closed; connections that cached it must drop it.
    pub fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }
}

#[derive(Default)]
struct Borrower {
    slabs: HashMap<u32, Arc<Slab>>,
    next_slab_id: u32,
    connections: usize,
    orphaned_at: Option<Instant>,
    /// Asked for by the borrower (`Linger`): a shorter grace than the donor's.
    grace: Option<Duration>,
}

impl Borrower {
    fn pages(&self) -> u64 {
        self.slabs.values().map(|s| s.pages).sum()
    }
}

pub struct Registry {
    lend_pages: u64,
    /// Most pages one borrower may hold, so one cannot take a whole donor
    /// from the others.
    borrower_cap_pages: u64,
    factory: SlabFactory,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    promised_pages: u64,
    borrowers: HashMap<BorrowerId, Borrower>,
    /// Lease mode (a cluster donor): only these ids may open slabs, each up
    /// to its leased pages. `None`: any authenticated borrower, first come.
    leases: Option<HashMap<BorrowerId, u64>>,
}

/// What STAT reports about the donor and one borrower.
pub struct Usage {
    pub lend_pages: u64,
    pub free_pages: u64,
    pub borrower_slabs: u32,
    pub borrower_pages: u64,
}

impl Registry {
    pub fn new(lend_pages: u64, factory: SlabFactory) -> Self {
        let borrower_cap_pages = u64::MAX;
        Registry { lend_pages, borrower_cap_pages, factory, inner: Mutex::new(Inner::default()) }
    }

    /// Limit every borrower to `pages` in all.
    pub fn with_borrower_cap(mut self, pages: u64) -> Self {
        self.borrower_cap_pages = pages;
        self
    }

    /// A registry where only leased credentials may open slabs (the control
    /// plane grants and revokes them); `lend_pages` caps the sum.
    pub fn leased(lend_pages: u64, factory: SlabFactory) -> Self {
        let inner = Inner { leases: Some(HashMap::new()), ..Inner::default() };
        let borrower_cap_pages = u64::MAX;
        Registry { lend_pages, borrower_cap_pages, factory, inner: Mutex::new(inner) }
    }

    /// Let `id` open slabs of up to `pages` in all (lease mode only).
    pub fn grant(&self, id: BorrowerId, pages: u64) {
        let mut inner = self.inner.lock();
        assert!(inner.leases.is_some(), "grant on a registry not in lease mode");
        inner.leases.as_mut().expect("checked").insert(id, pages);
    }

    /// End `id`'s lease: its slabs are freed now, even if it is connected
    /// (its connections see them closed). Returns the pages freed.
    pub fn revoke(&self, id: BorrowerId) -> u64 {
        let mut inner = self.inner.lock();
        if let Some(leases) = inner.leases.as_mut() {
            leases.remove(&id);
        }
        let Some(b) = inner.borrowers.get_mut(&id) else { return 0 };
        let slabs: Vec<Arc<Slab>> = b.slabs.drain().map(|(_, s)| s).collect();
        let pages: u64 = slabs.iter().map(|s| s.pages).sum();
        inner.promised_pages -= pages;
        if inner.borrowers.get(&id).is_some_and(|b| b.connections == 0) {
            inner.borrowers.remove(&id);
        }
        drop(inner);
        for s in &slabs {
            retire(s);
        }
        pages
    }

    pub fn lend_pages(&self) -> u64 {
        self.lend_pages
    }

    /// A connection for `id` begins.
    pub fn attach(&self, id: BorrowerId) {
        let mut inner = self.inner.lock();
        let b = inner.borrowers.entry(id).or_default();
        b.connections += 1;
        b.orphaned_at = None;
    }

    /// A connection for `id` ends; its slabs start their grace period when it
    /// was the last one, or are freed now if the borrower asked for no grace
    /// (it is exiting: see `Opcode::Linger`).
    pub fn detach(&self, id: BorrowerId) {
        let mut inner = self.inner.lock();
        let Some(b) = inner.borrowers.get_mut(&id) else { return };
        b.connections = b.connections.saturating_sub(1);
        if b.connections > 0 {
            return;
        }
        b.orphaned_at = Some(Instant::now());
        let leased = inner.leases.as_ref().is_some_and(|l| l.contains_key(&id));
        if inner.borrowers[&id].grace == Some(Duration::ZERO) && !leased {
            let retired = free_borrower(&mut inner, &id);
            drop(inner);
            retired.iter().for_each(|s| retire(s));
            tracing::info!(slabs = retired.len(), "freed the slabs of an exiting borrower");
        }
    }

    /// Promise `pages` of the budget to a new slab of borrower `id`. A
    /// `sealed` slab also keeps a 16-byte sidecar a page (the borrower's
    /// AEAD tags), allocated as pages are written: 0.4% over the budget.
    pub fn open(&self, id: BorrowerId, pages: u64, sealed: bool) -> Result<u32, Status> {
        if pages == 0 {
            return Err(Status::BadLength);
        }
        let mut inner = self.inner.lock();
        if pages > self.lend_pages - inner.promised_pages {
            return Err(Status::NoSpace);
        }
        let leased = inner.leases.as_ref().map(|l| l.get(&id).copied().unwrap_or(0));
        let b = inner.borrowers.entry(id).or_default();
        if leased.is_some_and(|quota| b.pages() + pages > quota) {
            tracing::warn!(
                pages,
                lease_pages = leased,
                "slab refused: beyond the borrower's lease"
            );
            return Err(Status::NoSpace);
        }
        if b.pages() + pages > self.borrower_cap_pages {
            let cap_pages = self.borrower_cap_pages;
            tracing::warn!(pages, cap_pages, "slab refused: beyond the per-borrower cap");
            return Err(Status::NoSpace);
        }
        if b.slabs.len() >= limits::SLABS_PER_BORROWER_MAX as usize {
            return Err(Status::TooManySlabs);
        }
        // The store is made under the lock: slab opens are rare (control
        // plane speed) and this keeps the budget check and the grant atomic.
        let store = (self.factory)(pages).map_err(|e| {
            tracing::warn!(pages, error = %e, "cannot make slab store");
            Status::NoSpace
        })?;
        let (store, sealed) = with_sidecars(store, sealed)?;
        b.next_slab_id = b.next_slab_id.wrapping_add(1).max(1);
        let slab_id = b.next_slab_id;
        let closed = AtomicBool::new(false);
        b.slabs.insert(slab_id, Arc::new(Slab { store, sealed, pages, closed }));
        inner.promised_pages += pages;
        Ok(slab_id)
    }

    pub fn get(&self, id: BorrowerId, slab: u32) -> Option<Arc<Slab>> {
        self.inner.lock().borrowers.get(&id)?.slabs.get(&slab).cloned()
    }

    /// Borrower `id` asks for its slabs to be freed `grace` after its last
    /// connection ends (the donor's grace still caps it).
    pub fn linger(&self, id: BorrowerId, grace: Duration) {
        self.inner.lock().borrowers.entry(id).or_default().grace = Some(grace);
    }

    /// Close a slab: free its memory now and return its pages to the budget.
    pub fn close(&self, id: BorrowerId, slab: u32) -> Result<(), Status> {
        let mut inner = self.inner.lock();
        let b = inner.borrowers.get_mut(&id).ok_or(Status::NoSuchSlab)?;
        let s = b.slabs.remove(&slab).ok_or(Status::NoSuchSlab)?;
        inner.promised_pages -= s.pages;
        drop(inner);
        retire(&s);
        Ok(())
    }

    pub fn usage(&self, id: BorrowerId) -> Usage {
        let inner = self.inner.lock();
        let (slabs, pages) =
            inner.borrowers.get(&id).map(|b| (b.slabs.len() as u32, b.pages())).unwrap_or((0, 0));
        Usage {
            lend_pages: self.lend_pages,
            free_pages: self.lend_pages - inner.promised_pages,
            borrower_slabs: slabs,
            borrower_pages: pages,
        }
    }

    /// Free the slabs of borrowers that have had no connection for `grace`,
    /// or for the shorter grace they asked for.
    /// Returns how many borrowers were reaped.
    pub fn reap_orphans(&self, grace: Duration) -> usize {
        let mut inner = self.inner.lock();
        let expired: Vec<BorrowerId> = inner
            .borrowers
            .iter()
            .filter(|(_, b)| {
                let grace = b.grace.map_or(grace, |asked| asked.min(grace));
                b.orphaned_at.is_some_and(|t| t.elapsed() >= grace)
            })
            // A leased borrower's slabs live as long as its lease.
            .filter(|(id, _)| !inner.leases.as_ref().is_some_and(|l| l.contains_key(*id)))
            .map(|(id, _)| *id)
            .collect();
        let mut retired = Vec::new();
        for id in &expired {
            retired.extend(free_borrower(&mut inner, id));
        }
        drop(inner);
        for s in &retired {
            retire(s);
        }
        if !expired.is_empty() {
            tracing::info!(
                borrowers = expired.len(),
                slabs = retired.len(),
                "reaped orphaned slabs"
            );
        }
        expired.len()
    }
}

/// Forget borrower `id` and give its slabs' pages back to the budget; the
/// caller retires the slabs once the lock is dropped.
fn free_borrower(inner: &mut Inner, id: &BorrowerId) -> Vec<Arc<Slab>> {
    let Some(b) = inner.borrowers.remove(id) else { return Vec::new() };
    inner.promised_pages -= b.pages();
    b.slabs.into_values().collect()
}

/// Mark a slab closed and free its memory at once: a connection that still
/// caches it sees it closed and drops it, so the memory is not held twice.
type SlabStores = (Arc<dyn PageStore>, Option<Arc<dyn SidecarStore>>);

/// The slab's store, and the same with sidecars when `sealed`.
fn with_sidecars(store: Arc<dyn PageStore>, sealed: bool) -> Result<SlabStores, Status> {
    if !sealed {
        return Ok((store, None));
    }
    let side: Arc<dyn SidecarStore> = Arc::new(LocalTags::new(store).map_err(|e| {
        tracing::warn!(error = %e, "no memory for a sealed slab's sidecars");
        Status::NoSpace
    })?);
    Ok((Arc::clone(&side) as Arc<dyn PageStore>, Some(side)))
}

fn retire(s: &Slab) {
    s.closed.store(true, Ordering::Release);
    if let Err(e) = s.store.discard(0, s.pages) {
        tracing::warn!(error = %e, "discard of a closed slab failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memlend_store::ram::{RamOptions, RamStore};

    fn registry(pages: u64) -> Registry {
        let factory: SlabFactory = Arc::new(|p| {
            let s: Arc<dyn PageStore> = Arc::new(RamStore::new(p, RamOptions::default())?);
            Ok(s)
        });
        Registry::new(pages, factory)
    }

    #[test]
    fn budget_is_enforced_and_returned() {
        let r = registry(100);
        let a = r.open([1; 16], 60, false).unwrap();
        assert_eq!(r.open([2; 16], 41, false), Err(Status::NoSpace));
        let b = r.open([2; 16], 40, false).unwrap();
        assert_eq!(r.usage([1; 16]).free_pages, 0);
        r.close([1; 16], a).unwrap();
        assert_eq!(r.usage([1; 16]).free_pages, 60);
        assert_eq!(r.close([1; 16], b), Err(Status::NoSuchSlab), "another borrower's slab");
        assert!(r.get([1; 16], b).is_none());
        assert!(r.get([2; 16], b).is_some());
    }

    #[test]
    fn one_borrower_cannot_take_more_than_its_cap() {
        let r = registry(100).with_borrower_cap(30);
        r.open([1; 16], 20, false).unwrap();
        assert_eq!(r.open([1; 16], 11, false), Err(Status::NoSpace));
        r.open([1; 16], 10, false).unwrap();
        r.open([2; 16], 30, false).unwrap();
        assert_eq!(r.usage([3; 16]).free_pages, 40, "the others still have room");
    }

    #[test]
    fn orphans_are_reaped_only_after_grace_and_only_without_connections() {
        let r = registry(10);
        r.attach([1; 16]);
        r.open([1; 16], 10, false).unwrap();
        assert_eq!(r.reap_orphans(Duration::ZERO), 0, "still connected");
        r.detach([1; 16]);
        assert_eq!(r.reap_orphans(Duration::from_secs(60)), 0, "within grace");
        r.attach([1; 16]);
        r.detach([1; 16]);
        assert_eq!(r.reap_orphans(Duration::ZERO), 1);
        assert_eq!(r.usage([1; 16]).free_pages, 10);
    }

    #[test]
    fn an_exiting_borrower_is_freed_when_its_last_connection_ends_not_before() {
        let r = registry(10);
        r.attach([1; 16]);
        r.attach([1; 16]);
        r.open([1; 16], 8, false).unwrap();
        r.open([2; 16], 2, false).unwrap();
        r.linger([1; 16], Duration::ZERO);
        r.detach([1; 16]);
        assert_eq!(r.usage([1; 16]).free_pages, 0, "one connection is left");
        r.detach([1; 16]);
        assert_eq!(r.usage([1; 16]).free_pages, 8, "freed at once, no grace");
        assert_eq!(r.usage([2; 16]).borrower_pages, 2, "the other borrower keeps its slab");
    }

    #[test]
    fn a_short_linger_shortens_the_grace_and_a_long_one_does_not_lengthen_it() {
        let r = registry(10);
        r.attach([1; 16]);
        r.open([1; 16], 5, false).unwrap();
        r.linger([1; 16], Duration::from_millis(20));
        r.detach([1; 16]);
        assert_eq!(r.reap_orphans(Duration::from_secs(60)), 0, "20 ms have not passed");
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(r.reap_orphans(Duration::from_secs(60)), 1);
        r.attach([2; 16]);
        r.open([2; 16], 5, false).unwrap();
        r.linger([2; 16], Duration::from_secs(3600));
        r.detach([2; 16]);
        assert_eq!(r.reap_orphans(Duration::ZERO), 1, "the donor's grace still caps it");
    }

    #[test]
    fn lease_mode_admits_only_leased_ids_up_to_their_lease() {
        let factory: SlabFactory = Arc::new(|p| {
            let s: Arc<dyn PageStore> = Arc::new(RamStore::new(p, RamOptions::default())?);
            Ok(s)
        });
        let r = Registry::leased(100, factory);
        assert_eq!(r.open([1; 16], 1, false), Err(Status::NoSpace), "no lease");
        r.grant([1; 16], 30);
        let a = r.open([1; 16], 20, false).unwrap();
        assert_eq!(r.open([1; 16], 11, false), Err(Status::NoSpace), "beyond the lease");
        r.open([1; 16], 10, false).unwrap();
        r.attach([1; 16]);
        r.detach([1; 16]);
        assert_eq!(r.reap_orphans(Duration::ZERO), 0, "a leased borrower is not an orphan");
        let slab = r.get([1; 16], a).unwrap();
        assert_eq!(r.revoke([1; 16]), 30);
        assert!(!slab.is_open(), "revoke closes slabs a connection holds");
        assert_eq!(r.usage([1; 16]).free_pages, 100);
        assert_eq!(r.open([1; 16], 1, false), Err(Status::NoSpace), "the lease is gone");
    }
}
