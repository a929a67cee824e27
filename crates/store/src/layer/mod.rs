//! Layers: stores that wrap another store and add one property each.
//!
//! A layer takes any `S: PageStore` (including `Arc<dyn PageStore>`), forwards
//! every operation to it and adds its one property on the way: `checksum`
//! verifies every page, `crypt` encrypts every page so the store below holds
//! only ciphertext, `stats` counts and times every operation, `stripe`
//! spreads pages over several stores (donors), `concat` joins stores of
//! any sizes end to end (leases), `mirror` keeps every page on two or more
//! stores and rebuilds a lost copy, `relocate` moves pages while in use,
//! `on_demand` opens its store on the first write, `watermark` calls a
//! hook when writes first reach a page, `append` writes scattered pages to
//! whole free chunks below (large writes for a disk), `pack`
//! compresses pages several to a page below (fewer bytes written), `lost` stands in for a store whose pages are gone, `snapshot` keeps the bytes pages held at a moment for a forked child, `local_tags` keeps
//! a sidecar per page for a store that has none (for `crypt`). The inner
//! store never knows it is wrapped. A layer's `StoreInfo::name` wraps the
//! inner name, so a stack reads as it is built: `checksum(stats(ram))`.
//! `registry` names the layers that wrap one store, so a stack is written
//! as a spec (`checksum,stats`) and built in one place.

pub mod append;
pub mod checksum;
pub mod concat;
pub mod crypt;
pub mod erasure;
mod fan_out;
#[cfg(test)]
mod flaky;
pub mod local_tags;
pub mod lost;
pub mod mirror;
pub mod on_demand;
pub mod pack;
pub mod registry;
pub mod relocate;
#[cfg(test)]
mod remap_tests;
pub mod report;
pub mod snapshot;
mod snapshot_spill;
pub mod stats;
pub mod stripe;
mod table;
pub mod watermark;

pub use checksum::Checksum;
pub use concat::Concat;
pub use crypt::Crypt;
pub use erasure::{Erasure, ErasureStats};
pub use local_tags::LocalTags;
pub use lost::Lost;
pub use mirror::{Mirror, MirrorOptions, MirrorStats};
pub use on_demand::OnDemand;
pub use registry::Stack;
pub use relocate::Relocatable;
pub use stats::{OpSnapshot, Stats, StatsSnapshot};
pub use stripe::Stripe;
