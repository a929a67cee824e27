//! Run one batch per member store, at once when several are involved: the
//! shared engine of the layers that spread pages over stores (`stripe`,
//! `concat`).

use crate::{PageStore, StoreResult};
use std::sync::Arc;

/// Run `f(store, batch)` for every store with a non-empty batch; on scoped
/// threads when more than one store is involved, so a batch costs the
/// slowest store's time, not the sum. A one-store batch stays on the
/// caller's thread: no hand-off.
pub(crate) fn each_store<T: Send>(
    stores: &[Arc<dyn PageStore>],
    batches: Vec<Vec<T>>,
    f: impl Fn(&dyn PageStore, &mut [T]) -> StoreResult<()> + Sync,
) -> StoreResult<()> {
    let mut busy: Vec<(usize, Vec<T>)> =
        batches.into_iter().enumerate().filter(|(_, b)| !b.is_empty()).collect();
    if busy.len() <= 1 {
        return busy.iter_mut().try_for_each(|(i, b)| f(stores[*i].as_ref(), b));
    }
    let f = &f;
    std::thread::scope(|s| {
        let (last, rest) = busy.split_last_mut().expect("more than one batch");
        let mut refused = Ok(());
        let mut handles = Vec::with_capacity(rest.len());
        for (i, b) in rest.iter_mut() {
            let store = stores[*i].as_ref();
            // Named ours: the preload shim keeps `memlend-*` threads out of
            // the program's allocator (crates/preload/src/thread_kind.rs).
            let worker = std::thread::Builder::new().name("memlend-fan".into());
            match worker.spawn_scoped(s, move || f(store, b)) {
                Ok(h) => handles.push(h),
                // No thread to be had: an operating error, tried again later.
                Err(e) => refused = refused.and(Err(e.into())),
            }
        }
        let mine = f(stores[last.0].as_ref(), &mut last.1);
        // The scope joins every thread even if this stops at an error.
        let theirs = handles.into_iter().try_for_each(|h| h.join().expect("store worker panicked"));
        mine.and(theirs).and(refused)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::{RamOptions, RamStore};
    use parking_lot::Mutex;

    #[test]
    fn workers_are_named_ours_and_the_caller_takes_one_batch() {
        let stores: Vec<Arc<dyn PageStore>> = (0..3)
            .map(|_| Arc::new(RamStore::new(8, RamOptions::default()).unwrap()) as _)
            .collect();
        let names = Mutex::new(Vec::new());
        each_store(&stores, vec![vec![0u8], vec![1], vec![2]], |_, _| {
            names.lock().push(std::thread::current().name().map(String::from));
            Ok(())
        })
        .unwrap();
        let mut names = names.into_inner();
        names.sort();
        let fan = Some("memlend-fan".to_string());
        assert_eq!(names.len(), 3);
        assert_eq!(names.iter().filter(|n| **n == fan).count(), 2, "{names:?}");
    }
}
