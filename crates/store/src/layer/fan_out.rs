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
        let handles: Vec<_> = rest
            .iter_mut()
            .map(|(i, b)| {
                let store = stores[*i].as_ref();
                s.spawn(move || f(store, b))
            })
            .collect();
        let mine = f(stores[last.0].as_ref(), &mut last.1);
        // The scope joins every thread even if this stops at an error.
        let theirs = handles.into_iter().try_for_each(|h| h.join().expect("store worker panicked"));
        mine.and(theirs)
    })
}
