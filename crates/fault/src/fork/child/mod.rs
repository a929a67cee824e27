//! A forked child's far pages: its own handler (`serve.rs`) keeps the pages
//! it read in (`cache.rs`) and reads the rest through its parent, over a
//! socket (`link.rs`), as the store held them at the fork (`source.rs`).

pub(crate) mod cache;
pub(crate) mod link;
pub(crate) mod serve;
pub(crate) mod source;
