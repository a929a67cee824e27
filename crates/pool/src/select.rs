//! Which server a client takes when several offer or grant (ACMS 4.3 names
//! first come, round robin and nearest; most free and balanced are ours).
//! Pluggable: the engine only sees the trait. Failure domains are weighed
//! before any selector: the engine hands it only the best-placed grants
//! (`engine/avoid.rs`).

use memlend_wire::ctrl::NodeId;
use std::str::FromStr;

/// A server the client could take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub node: NodeId,
    pub available_bytes: u64,
    /// Request-to-grant time measured by the client, if any.
    pub rtt_us: Option<u32>,
    /// Lower arrived earlier.
    pub arrival_order: u64,
}

pub trait Selector {
    /// The index of the chosen candidate; None only for an empty slice.
    fn pick(&mut self, candidates: &[Candidate]) -> Option<usize>;
    /// A copy with the same state (the engine is cloned by the model check).
    fn clone_box(&self) -> Box<dyn Selector + Send>;
    /// Whether to wait a moment for more grants before choosing. First come
    /// does not: the first grant is its answer.
    fn waits_for_more(&self) -> bool {
        true
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectorKind {
    FirstCome,
    RoundRobin,
    Nearest,
    MostFree,
    Balanced,
}

impl FromStr for SelectorKind {
    type Err = String;
    fn from_str(s: &str) -> Result<SelectorKind, String> {
        match s {
            "first" | "first-come" => Ok(SelectorKind::FirstCome),
            "round-robin" => Ok(SelectorKind::RoundRobin),
            "nearest" => Ok(SelectorKind::Nearest),
            "most-free" => Ok(SelectorKind::MostFree),
            "balanced" => Ok(SelectorKind::Balanced),
            _ => Err(format!(
                "unknown selector {s:?}: first, round-robin, nearest, most-free or balanced"
            )),
        }
    }
}

pub fn make(kind: SelectorKind) -> Box<dyn Selector + Send> {
    match kind {
        SelectorKind::FirstCome => Box::new(FirstCome),
        SelectorKind::RoundRobin => Box::new(RoundRobin::default()),
        SelectorKind::Nearest => Box::new(Nearest),
        SelectorKind::MostFree => Box::new(MostFree),
        SelectorKind::Balanced => Box::new(Balanced),
    }
}

fn first_by<K: Ord>(c: &[Candidate], key: impl Fn(&Candidate) -> K) -> Option<usize> {
    (0..c.len()).min_by_key(|&i| key(&c[i]))
}

#[derive(Clone)]
pub struct FirstCome;
impl Selector for FirstCome {
    fn pick(&mut self, c: &[Candidate]) -> Option<usize> {
        first_by(c, |x| x.arrival_order)
    }
    fn waits_for_more(&self) -> bool {
        false
    }
    fn clone_box(&self) -> Box<dyn Selector + Send> {
        Box::new(self.clone())
    }
}

/// Takes the next node id after the last one taken, so load spreads over
/// every server in turn whatever order they answer in.
#[derive(Clone, Default)]
pub struct RoundRobin {
    last: Option<NodeId>,
}
impl Selector for RoundRobin {
    fn pick(&mut self, c: &[Candidate]) -> Option<usize> {
        let after = |x: &Candidate| self.last.is_some_and(|l| x.node > l);
        let i = first_by(c, |x| (!after(x), x.node))?;
        self.last = Some(c[i].node);
        Some(i)
    }
    fn clone_box(&self) -> Box<dyn Selector + Send> {
        Box::new(self.clone())
    }
}

#[derive(Clone)]
pub struct Nearest;
impl Selector for Nearest {
    fn pick(&mut self, c: &[Candidate]) -> Option<usize> {
        first_by(c, |x| (x.rtt_us.unwrap_or(u32::MAX), x.arrival_order))
    }
    fn clone_box(&self) -> Box<dyn Selector + Send> {
        Box::new(self.clone())
    }
}

#[derive(Clone)]
pub struct MostFree;
impl Selector for MostFree {
    fn pick(&mut self, c: &[Candidate]) -> Option<usize> {
        first_by(c, |x| (std::cmp::Reverse(x.available_bytes), x.arrival_order))
    }
    fn clone_box(&self) -> Box<dyn Selector + Send> {
        Box::new(self.clone())
    }
}

/// RTT and room weighed together: the least `(rtt / nearest rtt) x (most
/// room / room)`. Every fault on a leased page pays the round trip, and a
/// donor with little room left is the one that reclaims first (a reclaim
/// moves every page of the lease), so twice as near counts as much as
/// twice the room. A candidate whose RTT is not known yet counts as the
/// farthest known one (as near as any, when none is known).
#[derive(Clone)]
pub struct Balanced;
impl Selector for Balanced {
    fn pick(&mut self, c: &[Candidate]) -> Option<usize> {
        let known = || c.iter().filter_map(|x| x.rtt_us).map(|r| f64::from(r.max(1)));
        let (near, far) = (known().fold(f64::MAX, f64::min), known().fold(1.0, f64::max));
        let room_max = c.iter().map(|x| x.available_bytes).max().unwrap_or(0).max(1) as f64;
        let score = |x: &Candidate| {
            let rtt = x.rtt_us.map_or(far, |r| f64::from(r.max(1)));
            let room = x.available_bytes as f64;
            if room == 0.0 {
                return f64::INFINITY;
            }
            (rtt / near.min(rtt)) * (room_max / room)
        };
        (0..c.len()).min_by(|&i, &j| {
            score(&c[i]).total_cmp(&score(&c[j])).then(c[i].arrival_order.cmp(&c[j].arrival_order))
        })
    }
    fn clone_box(&self) -> Box<dyn Selector + Send> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(node: NodeId, free: u64, rtt: Option<u32>, order: u64) -> Candidate {
        Candidate { node, available_bytes: free, rtt_us: rtt, arrival_order: order }
    }

    #[test]
    fn each_policy_picks_as_named() {
        let v = [c(5, 10, Some(300), 2), c(3, 30, None, 1), c(9, 20, Some(100), 3)];
        assert_eq!(make(SelectorKind::FirstCome).pick(&v), Some(1));
        assert_eq!(make(SelectorKind::Nearest).pick(&v), Some(2));
        assert_eq!(make(SelectorKind::MostFree).pick(&v), Some(1));
        let mut rr = make(SelectorKind::RoundRobin);
        let order: Vec<NodeId> = (0..4).map(|_| v[rr.pick(&v).unwrap()].node).collect();
        assert_eq!(order, vec![3, 5, 9, 3], "every server in turn");
        assert_eq!(make(SelectorKind::FirstCome).pick(&[]), None);
        assert!("nope".parse::<SelectorKind>().is_err());
        assert_eq!("most-free".parse::<SelectorKind>(), Ok(SelectorKind::MostFree));
        assert_eq!("balanced".parse::<SelectorKind>(), Ok(SelectorKind::Balanced));
    }

    #[test]
    fn balanced_weighs_rtt_against_room() {
        let mut b = make(SelectorKind::Balanced);
        // Same room: the nearer. Same RTT: the roomier.
        assert_eq!(b.pick(&[c(1, 100, Some(400), 1), c(2, 100, Some(200), 2)]), Some(1));
        assert_eq!(b.pick(&[c(1, 50, Some(200), 1), c(2, 100, Some(200), 2)]), Some(1));
        // 3x nearer beats 2x the room; 1.5x nearer does not.
        assert_eq!(b.pick(&[c(1, 100, Some(300), 1), c(2, 50, Some(100), 2)]), Some(1));
        assert_eq!(b.pick(&[c(1, 100, Some(150), 1), c(2, 50, Some(100), 2)]), Some(0));
        // Unknown RTT counts as the farthest known; a full donor never wins.
        let v = [c(1, 100, None, 1), c(2, 100, Some(100), 2), c(3, 100, Some(300), 3)];
        assert_eq!(b.pick(&v), Some(1));
        assert_eq!(b.pick(&[c(1, 0, Some(1), 1), c(2, 1, Some(900), 2)]), Some(1));
        // No RTT known at all: the roomiest, then the first to answer.
        assert_eq!(b.pick(&[c(1, 10, None, 2), c(2, 10, None, 1), c(3, 5, None, 0)]), Some(1));
        assert_eq!(b.pick(&[]), None);
    }
}
