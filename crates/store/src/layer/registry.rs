//! Named layers: a stack written as a spec, the way nbdkit stacks filters on
//! its command line, and built in one place.
//!
//! A spec lists layers outermost first, comma-separated: `checksum,stats`
//! builds `checksum(stats(base))`, which is also how the stack's
//! `StoreInfo::name` reads. The base is whatever the caller opened (a donor,
//! a stripe, a mirror, leases, an SSD file): the layers that join several
//! stores (stripe, concat, mirror, erasure) are chosen by where the pages go,
//! not named here, because each needs its children and their sizes.
//!
//! A new layer is its own file in `layer/` (the `PageStore` wrapper, what
//! it `ADDS`, and a `named` function that builds it over a base and pushes
//! its report line), its `mod` line in `layer/mod.rs`, and one entry in
//! [`LAYERS`].

use super::{checksum, crypt, pack, stats};
use crate::{PageStore, StoreResult};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Most layers in one spec: each adds per-page work or memory, and a
/// longer stack is a typo more often than a wish.
pub const LAYERS_MAX: usize = 8;

/// Longest spec accepted, in bytes (it travels in an environment variable).
pub const SPEC_BYTES_MAX: usize = 256;

pub use super::report::Report;

/// Wraps a store in one layer, adding the layer's report line, if any.
pub type Wrap = fn(Arc<dyn PageStore>, &mut Vec<Report>) -> StoreResult<Arc<dyn PageStore>>;

/// One entry of the registry.
pub struct Named {
    pub name: &'static str,
    /// The one property the layer adds, for `--help` and errors.
    pub adds: &'static str,
    wrap: Wrap,
    /// Pages the store below needs for this layer to offer `pages` (the
    /// same for most; `pack` keeps some bins spare), and its inverse.
    pub below: fn(u64) -> u64,
    pub offered: fn(u64) -> u64,
}

fn same(pages: u64) -> u64 {
    pages
}

/// A layer that offers every page of the store below.
const fn plain(name: &'static str, adds: &'static str, wrap: Wrap) -> Named {
    Named { name, adds, wrap, below: same, offered: same }
}

/// Every layer a spec may name: one line each, the layer's own file giving
/// its `named` function and what it `ADDS`.
pub static LAYERS: &[Named] = &[
    plain("checksum", checksum::ADDS, checksum::named),
    plain("crypt", crypt::ADDS, crypt::named),
    Named {
        name: "pack",
        adds: pack::ADDS,
        wrap: pack::named,
        below: pack::bins_for,
        offered: pack::pages_for,
    },
    Named {
        name: "pack-zstd",
        adds: pack::ADDS_ZSTD,
        wrap: pack::named_zstd,
        below: pack::bins_for,
        offered: pack::pages_for,
    },
    plain("stats", stats::ADDS, stats::named),
];

/// A checked spec: layers outermost first, each at most once.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Stack {
    layers: Vec<&'static str>,
}

/// A stack built over a base.
pub struct Built {
    pub store: Arc<dyn PageStore>,
    /// One line per layer that has something to say, outermost first.
    pub reports: Vec<Report>,
}

impl Stack {
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Pages the base must have for the stack to offer `pages`.
    pub fn pages_below(&self, pages: u64) -> u64 {
        self.named().fold(pages, |p, n| (n.below)(p))
    }

    /// Pages the stack offers over a base of `pages` pages.
    pub fn pages_offered(&self, pages: u64) -> u64 {
        self.named().rev().fold(pages, |p, n| (n.offered)(p))
    }

    /// The layers, outermost first.
    fn named(&self) -> impl DoubleEndedIterator<Item = &'static Named> + '_ {
        self.layers.iter().map(|name| find(name).expect("a checked stack names known layers"))
    }

    /// Wrap `base` in the layers, innermost first.
    pub fn build(&self, base: Arc<dyn PageStore>) -> StoreResult<Built> {
        let mut store = base;
        let mut reports = Vec::new();
        for name in self.layers.iter().rev() {
            let named = find(name).expect("a checked stack names known layers");
            store = (named.wrap)(store, &mut reports)?;
        }
        reports.reverse();
        Ok(Built { store, reports })
    }
}

fn find(name: &str) -> Option<&'static Named> {
    LAYERS.iter().find(|n| n.name == name)
}

/// "checksum, crypt, pack, pack-zstd, stats" (for errors and `--help`).
pub fn known() -> String {
    LAYERS.iter().map(|n| n.name).collect::<Vec<_>>().join(", ")
}

/// Why a spec was refused.
#[derive(Debug, PartialEq, Eq)]
pub struct SpecError(pub String);

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpecError {}

impl FromStr for Stack {
    type Err = SpecError;

    /// The empty string (or only spaces) is the empty stack.
    fn from_str(spec: &str) -> Result<Stack, SpecError> {
        if spec.len() > SPEC_BYTES_MAX {
            return Err(SpecError(format!(
                "a layer spec of {} bytes is over the limit of {SPEC_BYTES_MAX}",
                spec.len()
            )));
        }
        let mut layers = Vec::new();
        if spec.trim().is_empty() {
            return Ok(Stack { layers });
        }
        for item in spec.split(',').map(str::trim) {
            let Some(named) = find(item) else {
                let what = if item.is_empty() {
                    "an empty name".to_string()
                } else {
                    format!("\"{item}\"")
                };
                return Err(SpecError(format!(
                    "layer spec \"{spec}\": {what} is not a layer (known: {})",
                    known()
                )));
            };
            if layers.contains(&named.name) {
                return Err(SpecError(format!("layer spec \"{spec}\": {item} is named twice")));
            }
            if layers.len() == LAYERS_MAX {
                return Err(SpecError(format!(
                    "layer spec \"{spec}\": more than {LAYERS_MAX} layers"
                )));
            }
            layers.push(named.name);
        }
        let stack = Stack { layers };
        if stack.layers.iter().filter(|name| name.starts_with("pack")).count() > 1 {
            return Err(SpecError(format!(
                "layer spec \"{spec}\": pack and pack-zstd would compress twice; name one"
            )));
        }
        Ok(stack)
    }
}

/// The spec, as it parses back: `checksum,stats`.
impl fmt::Display for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.layers.join(","))
    }
}

impl fmt::Debug for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stack({self})")
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
