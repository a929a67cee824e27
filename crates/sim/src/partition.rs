//! A network partition: from `start_s` to `heal_s` the nodes with index
//! below `share * nodes` hear nothing from the others and the others
//! nothing from them (datagrams across are dropped when sent). Lease
//! partners on both sides declare each other dead: donors revoke, borrowers
//! lose. What the issue asks is that nothing is stranded 30 s after the
//! partition heals: no lease one side holds that the other does not know.

use serde::Serialize;

/// Seconds after the heal at which leases are checked.
pub const CHECK_AFTER_HEAL_S: u64 = 30;

#[derive(Clone, Copy, Debug)]
pub struct Partition {
    pub start_s: u64,
    pub heal_s: u64,
    /// Share of the nodes (the lowest indices) on the first side.
    pub share: f64,
}

impl Partition {
    /// Parse `START,HEAL,SHARE` (seconds, seconds, a fraction).
    pub fn parse(s: &str) -> Result<Partition, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let [start, heal, share] = parts[..] else {
            return Err(format!("partition {s:?}: expected START_S,HEAL_S,SHARE"));
        };
        let num = |v: &str, what: &str| v.parse::<f64>().map_err(|e| format!("{what} {v:?}: {e}"));
        let p = Partition {
            start_s: num(start, "start")? as u64,
            heal_s: num(heal, "heal")? as u64,
            share: num(share, "share")?,
        };
        Ok(p)
    }

    pub fn check(&self, seconds: u64) -> Result<(), String> {
        if self.start_s >= self.heal_s {
            return Err("a partition heals after it starts".into());
        }
        if !(self.share > 0.0 && self.share < 1.0) {
            return Err(format!("a partition's share is in (0, 1), got {}", self.share));
        }
        if self.heal_s + CHECK_AFTER_HEAL_S > seconds {
            return Err(format!(
                "the run ends before {CHECK_AFTER_HEAL_S} s after the heal at {} s",
                self.heal_s
            ));
        }
        Ok(())
    }

    /// Whether a datagram from node `a` to node `b` is dropped at `now_s`.
    pub fn cuts(&self, nodes: usize, now_s: u64, a: u32, b: u32) -> bool {
        let split = (nodes as f64 * self.share).round() as u32;
        (self.start_s..self.heal_s).contains(&now_s) && ((a < split) != (b < split))
    }
}

/// What a run with a partition reports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PartitionOutcome {
    pub start_s: u64,
    pub heal_s: u64,
    pub share: f64,
    /// Datagrams dropped because they crossed it.
    pub dropped: u64,
    /// Leases held by either side and unknown to the other, and all leases
    /// held, `CHECK_AFTER_HEAL_S` after the heal.
    pub stranded_after_heal: u64,
    pub leases_after_heal: u64,
}
