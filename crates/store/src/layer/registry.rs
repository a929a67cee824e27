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
//! A new layer is its own file in `layer/` plus one entry in [`LAYERS`].

use super::{Checksum, Crypt, LocalTags, Stats};
use crate::{PageStore, StoreError, StoreResult};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Most layers in one spec: each adds per-page work or memory, and a
/// longer stack is a typo more often than a wish.
pub const LAYERS_MAX: usize = 8;

/// Longest spec accepted, in bytes (it travels in an environment variable).
pub const SPEC_BYTES_MAX: usize = 256;

/// What a built stack's layers have to say at the end of a run.
pub type Report = Box<dyn Fn() -> String + Send + Sync>;

/// Wraps a store in one layer, adding the layer's report line, if any.
type Wrap = fn(Arc<dyn PageStore>, &mut Vec<Report>) -> StoreResult<Arc<dyn PageStore>>;

/// One entry of the registry.
pub struct Named {
    pub name: &'static str,
    /// The one property the layer adds, for `--help` and errors.
    pub adds: &'static str,
    wrap: Wrap,
}

/// Every layer a spec may name.
pub static LAYERS: &[Named] = &[
    Named {
        name: "checksum",
        adds: "a CRC32C of every page kept here, checked on every read",
        wrap: checksum,
    },
    Named {
        name: "crypt",
        adds: "AES-256-GCM under a fresh key that never leaves the process, tags kept here",
        wrap: crypt,
    },
    Named {
        name: "stats",
        adds: "counts and times every operation, reported at exit",
        wrap: stats,
    },
];

fn checksum(base: Arc<dyn PageStore>, out: &mut Vec<Report>) -> StoreResult<Arc<dyn PageStore>> {
    let layer = Arc::new(Checksum::new(base)?);
    let seen = layer.clone();
    out.push(Box::new(move || format!("checksum: {} corrupt pages", seen.corrupt_pages())));
    Ok(layer)
}

/// Tags stay in this process (`LocalTags`): the base may be a file or a
/// stack of donors, and only the pages below need to move.
fn crypt(base: Arc<dyn PageStore>, out: &mut Vec<Report>) -> StoreResult<Arc<dyn PageStore>> {
    let mut key = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
        .map_err(|_| StoreError::Io(std::io::Error::other("no random key for the crypt layer")))?;
    let layer = Arc::new(Crypt::new(LocalTags::new(base)?, key)?);
    let seen = layer.clone();
    out.push(Box::new(move || format!("crypt: {} corrupt pages", seen.corrupt_pages())));
    Ok(layer)
}

fn stats(base: Arc<dyn PageStore>, out: &mut Vec<Report>) -> StoreResult<Arc<dyn PageStore>> {
    let layer = Arc::new(Stats::new(base));
    let seen = layer.clone();
    out.push(Box::new(move || {
        let s = seen.snapshot();
        let op = |name: &str, o: &super::OpSnapshot| {
            format!(
                "{name} {} ops {} pages p50 {:.1} us p99 {:.1} us",
                o.ops, o.pages, o.latency_us_p50, o.latency_us_p99
            )
        };
        format!(
            "stats: {}; {}; {}",
            op("read", &s.read),
            op("write", &s.write),
            op("discard", &s.discard)
        )
    }));
    Ok(layer)
}

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

/// "checksum, crypt, stats" (for errors and `--help`).
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
        Ok(Stack { layers })
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
