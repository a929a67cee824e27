//! Donors a demand should not get its lease from: the nodes that already
//! hold the other copy of the pages it is for (a mirror's other leg), and,
//! where peers name failure domains, every node in their domains. A lease
//! on an avoided node is never taken; one in an avoided domain only when no
//! other node can lend, so a small cluster still mirrors across nodes while
//! a racked one mirrors across racks.

use super::Engine;
use memlend_wire::ctrl::NodeId;

/// Most nodes one demand may avoid: the donors of a mirror's other leg.
/// A leg of a region is one lease per segment and a region has at most a
/// few dozen segments, so this is far above what a borrower sends.
pub const AVOID_NODES_MAX: usize = 64;

/// How well a donor suits a demand, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Fit {
    /// Neither avoided nor in an avoided domain.
    Apart,
    /// In the failure domain of an avoided node: taken only when nothing
    /// apart can lend.
    SameDomain,
    /// An avoided node: never taken.
    Avoided,
}

impl Engine {
    /// How `node` suits a demand that avoids `avoid`.
    pub(super) fn fit(&self, avoid: &[NodeId], node: NodeId) -> Fit {
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
        } else {
            Fit::Apart
        }
    }

    /// The indices of `nodes` a demand avoiding `avoid` may use: those apart
    /// if any, else those in a shared domain; never an avoided node.
    pub(super) fn usable(&self, avoid: &[NodeId], nodes: &[NodeId]) -> Vec<usize> {
        let fits: Vec<Fit> = nodes.iter().map(|&n| self.fit(avoid, n)).collect();
        let Some(best) = fits.iter().copied().filter(|&f| f != Fit::Avoided).min() else {
            return Vec::new();
        };
        (0..nodes.len()).filter(|&i| fits[i] == best).collect()
    }
}
