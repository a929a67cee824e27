//! What every connection of one `serve` call shares.

use super::config::NbdConfig;
use super::export::{Export, ExportState};
use crate::lifecycle::Shutdown;
use std::collections::HashSet;
use std::io;
use std::sync::Arc;

pub(crate) struct Server {
    /// `exports[0]` is the default, also served for the empty name.
    pub exports: Vec<Arc<ExportState>>,
    pub cfg: NbdConfig,
    pub shutdown: Shutdown,
}

impl Server {
    pub fn new(exports: Vec<Export>, cfg: NbdConfig, shutdown: Shutdown) -> io::Result<Self> {
        cfg.validate()?;
        let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
        if exports.is_empty() {
            return Err(invalid("nbd: at least one export is needed".into()));
        }
        let mut names = HashSet::new();
        for e in &exports {
            if !names.insert(e.name.clone()) {
                return Err(invalid(format!("nbd: export name {:?} is used twice", e.name)));
            }
        }
        let exports = exports
            .into_iter()
            .map(|e| ExportState::new(e).map(Arc::new))
            .collect::<io::Result<_>>()?;
        Ok(Server { exports, cfg, shutdown })
    }

    /// The export a client asked for; the empty name is the default.
    pub fn find(&self, name: &[u8]) -> Option<&Arc<ExportState>> {
        if name.is_empty() {
            return self.exports.first();
        }
        self.exports.iter().find(|e| e.name.as_bytes() == name)
    }
}
