//! When a node tells the whole cluster about itself (its "summary": class,
//! memory, where it serves pages), and how long a peer that only sends
//! summaries may stay silent.
//!
//! A summary to every node every `heartbeat_ms` would make what a node
//! receives grow with N (259 KB/s per node at 1000 simulated nodes,
//! docs/scale.md). So a summary goes to everyone only
//!
//! - at once when borrowers must know: the node became a server with room
//!   for one grant unit (new supply, whom `request_dests` asks), or stopped
//!   being a server after saying it had room;
//! - else on a slow refresh whose period grows with the cluster:
//!   members / `summaries_per_s` (at least `heartbeat_ms`, at most
//!   `refresh_max_ms`), jittered by ±20% so nodes do not fall into step. A
//!   node thus receives about `summaries_per_s` refreshes a second whatever
//!   N is, and a 2- or 3-node cluster refreshes every `heartbeat_ms`
//!   (500 ms).
//!
//! What waits for the refresh: amounts; a server's room lent out (a
//! borrower that asks it is answered with its summary instead of silence,
//! and asks elsewhere); classes other than server (they only weigh in ACMS
//! 4.3's choice of who broadcasts offers, and borrowers still find servers
//! by the 3-way handshake). Measured at 1000 simulated nodes, announcing
//! every class change and every loss of room at once cost 7.7 KB/s
//! received per node, and this rule 6.7 KB/s or less (docs/scale.md).
//! Lease partners hear each other every `heartbeat_ms` regardless
//! (`heartbeat.rs`).

use super::MS;

/// Jitter of the refresh period, in percent either way.
const JITTER_PCT: u64 = 20;
/// A silent non-partner is suspect after this many refresh periods, and gone
/// after `DEAD_PERIODS` (with the jitter, two periods cover one lost
/// refresh).
const SUSPECT_PERIODS: u64 = 2;
const DEAD_PERIODS: u64 = 4;

/// What the node last told everyone, and when.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Whether the last summary said "a server with room"; None before the
    /// first.
    said_room: Option<bool>,
    said_us: u64,
    /// Since then, some asker was told there was no room.
    told_no_room: bool,
    /// This period's jitter, in per mille of the period (800..=1200).
    jitter_permille: u64,
    sent: u64,
}

/// The refresh period for a cluster of `members` peers, before jitter.
pub fn refresh_us(members: usize, heartbeat_ms: u64, per_s: u64, max_ms: u64) -> u64 {
    let ms = (members as u64).saturating_mul(1_000) / per_s.max(1);
    ms.clamp(heartbeat_ms, max_ms.max(heartbeat_ms)) * MS
}

/// (suspect, dead) silence for a peer that is no lease partner: never
/// shorter than a partner's, and long enough for refreshes to be lost.
pub fn far_timeouts_us(refresh_us: u64, suspect_us: u64, dead_us: u64) -> (u64, u64) {
    let most_us = refresh_us + refresh_us * JITTER_PCT / 100;
    (suspect_us.max(SUSPECT_PERIODS * most_us), dead_us.max(DEAD_PERIODS * most_us))
}

impl Summary {
    /// Is a summary due now? `server` is whether the node is a server now,
    /// `room` whether it has room for one grant unit; `period_us` the
    /// refresh period for the cluster as it is now (so a period chosen
    /// when the node knew few peers does not fire early once it knows
    /// many).
    pub fn due(&self, now_us: u64, server: bool, room: bool, period_us: u64) -> bool {
        let refresh_us = period_us * self.jitter_permille / 1_000;
        match self.said_room {
            None => true,
            // New supply (to everyone, or to those told there was none):
            // borrowers should know at once.
            Some(false) if room => true,
            Some(true) if room && self.told_no_room => true,
            // No longer lending at all: stop being asked.
            Some(true) if !server => true,
            // Room lent out but still a server: a borrower that asks is
            // told in answer (`on_request`), the rest at the refresh.
            _ => now_us >= self.said_us + refresh_us,
        }
    }

    /// One peer was told there is no room (an answer to its request): when
    /// room comes back it is new supply to that peer, so it is due at once.
    pub fn told_no_room(&mut self) {
        self.told_no_room = true;
    }

    /// A summary went out saying `room`. The next refresh's jitter is a
    /// hash of the node and the count, so a run is reproducible without a
    /// random source.
    pub fn said(&mut self, now_us: u64, room: bool, node: u64) {
        self.said_room = Some(room);
        self.said_us = now_us;
        self.told_no_room = false;
        self.sent += 1;
        let h = mix(node ^ self.sent.rotate_left(32));
        self.jitter_permille = 1_000 - JITTER_PCT * 10 + h % (JITTER_PCT * 20 + 1);
    }
}

/// SplitMix64's finalizer: a well-mixed number from any input.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refresh_grows_with_the_cluster_within_bounds() {
        assert_eq!(refresh_us(2, 500, 4, 300_000), 500 * MS);
        assert_eq!(refresh_us(100, 500, 4, 300_000), 25_000 * MS);
        assert_eq!(refresh_us(100_000, 500, 4, 300_000), 300_000 * MS);
        // A small cluster keeps the partners' timeouts (1.5 s, 3 s).
        assert_eq!(far_timeouts_us(500 * MS, 1_500 * MS, 3_000 * MS), (1_500 * MS, 3_000 * MS));
    }

    #[test]
    fn new_room_and_leaving_are_due_at_once_the_rest_at_the_jittered_refresh() {
        let p = 10_000 * MS;
        let mut s = Summary::default();
        assert!(s.due(0, false, false, p), "the first summary");
        s.said(0, false, 7);
        assert!(!s.due(1, false, false, p));
        assert!(s.due(1, true, true, p), "a server with room says so at once");
        s.said(1, true, 7);
        assert!(!s.due(2, true, false, p), "room lent out: told on asking");
        assert!(s.due(2, false, false, p), "no longer a server: at once");
        assert!(!s.due(1 + 7_900 * MS, true, true, p));
        assert!(s.due(1 + 12_000 * MS, true, true, p), "refreshed within +20%");
        s.told_no_room();
        assert!(!s.due(2, true, false, p));
        assert!(s.due(2, false, false, p), "still: no longer a server");
        assert!(s.due(3, true, true, p), "room again after telling an asker there was none");
        let mut jitters = std::collections::BTreeSet::new();
        for _ in 0..8 {
            s.said(0, true, 7);
            assert!((800..=1_200).contains(&s.jitter_permille));
            jitters.insert(s.jitter_permille);
        }
        assert!(jitters.len() > 4, "jittered: {jitters:?}");
    }
}
