//! `--timeline FILE`: what the node did, one JSON object per line, for the
//! ACMS Figure 6 picture: a sample each second (class, memory, data-plane
//! pages served) and every control message sent or received.

use memlend_pool::engine::Engine;
use memlend_server::page::ServerStats;
use memlend_wire::ctrl::{Body, NodeId};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::atomic::Ordering::Relaxed;

pub struct Timeline {
    out: BufWriter<File>,
    /// Wall-clock ms at the engine's time zero, so nodes' lines line up.
    epoch_ms: u64,
}

impl Timeline {
    pub fn create(path: &std::path::Path) -> std::io::Result<Timeline> {
        let epoch_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        Ok(Timeline { out: BufWriter::new(File::create(path)?), epoch_ms })
    }

    pub fn message(&mut self, now_us: u64, dir: &str, body: &Body, peer: NodeId) {
        let kind = memlend_pool::engine::KINDS[memlend_pool::engine::kind(body)];
        if kind == "heartbeat" {
            return; // steady background, not part of the story
        }
        let line =
            serde_json::json!({ "t_ms": self.t(now_us), "dir": dir, "type": kind, "peer": peer });
        let _ = writeln!(self.out, "{line}");
        let _ = self.out.flush();
    }

    pub fn sample(&mut self, now_us: u64, e: &Engine, s: &ServerStats) {
        let st = e.status();
        let line = serde_json::json!({
            "t_ms": self.t(now_us),
            "class": super::status::class_name(st.class),
            "used_bytes": st.used_bytes,
            "lendable_bytes": st.lendable_bytes,
            "lent_bytes": e.lent_bytes(),
            "borrowed_bytes": e.borrowed_bytes(),
            "pages_read": s.pages_read.load(Relaxed),
            "pages_written": s.pages_written.load(Relaxed),
        });
        let _ = writeln!(self.out, "{line}");
        let _ = self.out.flush();
    }

    fn t(&self, now_us: u64) -> u64 {
        self.epoch_ms + now_us / 1_000
    }
}
