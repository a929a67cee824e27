//! Donors a demand should not get its lease from: the nodes that already
//! hold the other copy of the pages it is for (a mirror's other leg), and,
//! where peers name failure domains, every node in their domains. A lease
//! on an avoided node is never taken; one in an avoided domain only when no
//! other node can lend, so a small cluster still mirrors across nodes while
//! a racked one mirrors across racks.
//!
//! Among the donors apart, a demand prefers the domains its owner already
//! borrows from: a leg that grows lease by lease stays in few domains and
//! leaves the rest to the other leg. Without it, a leg spread by a
//! most-free or round-robin selector over all four racks of a simulated
//! cluster left the other leg no rack apart (38-44% of second-copy bytes
//! shared a rack with the first copy, docs/scale.md).

use super::Engine;
use memlend_wire::ctrl::NodeId;

/// Most nodes one demand may avoid: the donors of a mirror's other leg.
/// A leg of a region is one lease per segment and a region has at most a
/// few dozen segments, so this is far above what a borrower sends.
pub const AVOID_NODES_MAX: usize = 64;

/// How well a donor suits a demand, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Fit {
    /// Apart, and in a domain the demand's owner already borrows from.
    Near,
    /// Neither avoided nor in an avoided domain.
    Apart,
    /// In the failure domain of an avoided node: taken only when nothing
    /// apart can lend.
    SameDomain,
    /// An avoided node: never taken.
    Avoided,
}

impl Engine {
    /// How `node` suits a demand of `owner` that avoids `avoid`. A demand
    /// that avoids nothing has no other copy to keep apart from, so no
    /// preference either.
    pub(super) fn fit(&self, owner: u64, avoid: &[NodeId], node: NodeId) -> Fit {
        if avoid.is_empty() {
            return Fit::Apart;
        }
        if avoid.contains(&node) {
            return Fit::Avoided;
        }
        let Some(domain) = self.members.get(node).map(|p| p.domain.as_str()) else {
            return Fit::Apart;
        };
        let shared = !domain.is_empty()
            && avoid.iter().any(|&a| self.members.get(a).is_some_and(|p| p.domain == domain));
        if shared {
            Fit::SameDomain
        } else if !domain.is_empty() && self.owner_borrows_in(owner, domain) {
            Fit::Near
        } else {
            Fit::Apart
        }
    }

    /// Whether `owner` holds a lease from a donor in `domain`.
    fn owner_borrows_in(&self, owner: u64, domain: &str) -> bool {
        self.borrowed.values().any(|b| {
            b.owner == owner && self.members.get(b.donor).is_some_and(|p| p.domain == domain)
        })
    }

    /// The indices of `nodes` a demand of `owner` avoiding `avoid` may ask
    /// or take: those apart (near or not) if any, else those in a shared
    /// domain; never an avoided node. Asking only the near ones would
    /// shrink the servers asked, and a demand would wait on their retries
    /// (a simulated p99 of 2 ms became 400 ms).
    pub(super) fn usable(&self, owner: u64, avoid: &[NodeId], nodes: &[NodeId]) -> Vec<usize> {
        let tier = |f: Fit| f.max(Fit::Apart);
        let fits: Vec<Fit> = nodes.iter().map(|&n| tier(self.fit(owner, avoid, n))).collect();
        let Some(best) = fits.iter().copied().filter(|&f| f != Fit::Avoided).min() else {
            return Vec::new();
        };
        (0..nodes.len()).filter(|&i| fits[i] == best).collect()
    }

    /// Of `usable` (indices into `nodes`), the near ones if any: what a
    /// demand takes among the grants it heard.
    pub(super) fn preferred(
        &self,
        owner: u64,
        avoid: &[NodeId],
        nodes: &[NodeId],
        usable: Vec<usize>,
    ) -> Vec<usize> {
        let near: Vec<usize> = usable
            .iter()
            .copied()
            .filter(|&i| self.fit(owner, avoid, nodes[i]) == Fit::Near)
            .collect();
        if near.is_empty() {
            usable
        } else {
            near
        }
    }
}
