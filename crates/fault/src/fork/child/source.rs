//! What a forked child's handler (`serve.rs`) reads its far pages from, and
//! the most one read asks for: the link to the parent (`link.rs`) is one
//! such source, and the handler never asks it for more than it carries.

use std::io;

/// Pages one request may ask for.
pub const LINK_PAGES_MAX: usize = 16;

/// Where a child reads its far pages: its parent, as the store held them at
/// the fork.
pub trait ChildSource: Send {
    /// Fill `out` (one page each, in order) with `pages`.
    fn read(&mut self, pages: &[u32], out: &mut [u8]) -> io::Result<()>;
}
