//! Names and addresses of a lab's pieces, all derived from its prefix so
//! that `lab down` can find everything even without the state file.

use anyhow::{bail, Context, Result};
use std::net::Ipv4Addr;
use std::path::PathBuf;

/// Lab cgroups live here, under the memory hierarchy's root (`cgroup.rs`).
pub const CGROUP_PARENT: &str = "memlend-lab";
pub const DEFAULT_PREFIX: &str = "ml";
/// Most nodes a lab may have: keeps veth names within 15 bytes and host
/// addresses inside a /24.
pub const NODES_MAX: usize = 200;

/// A prefix must keep `<prefix>-v<N>` within the kernel's 15-byte interface
/// names, and must not contain '-' so `ml` never matches `ml-x-n1`.
pub fn check_prefix(prefix: &str) -> Result<()> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 10
        && prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !ok {
        bail!("prefix {prefix:?} must be 1 to 10 lowercase letters or digits");
    }
    Ok(())
}

/// State files: the default lab uses /run/memlend-lab; other prefixes get
/// their own directory so labs (and tests) can run side by side.
pub fn state_dir(prefix: &str) -> PathBuf {
    if prefix == DEFAULT_PREFIX {
        PathBuf::from("/run/memlend-lab")
    } else {
        PathBuf::from(format!("/run/memlend-lab-{prefix}"))
    }
}

pub fn bridge(prefix: &str) -> String {
    format!("{prefix}br0")
}

pub fn node_name(prefix: &str, i: usize) -> String {
    format!("{prefix}-n{i}")
}

/// The root-side end of node i's veth pair.
pub fn veth_host(prefix: &str, i: usize) -> String {
    format!("{prefix}-v{i}")
}

/// The node-side end before it moves into the namespace (renamed eth0 there).
pub fn veth_peer(prefix: &str, i: usize) -> String {
    format!("{prefix}-p{i}")
}

/// Whether `name` is `<prefix><tag><digits>`, e.g. `ml-n3` for tag "-n".
pub fn is_indexed(name: &str, prefix: &str, tag: &str) -> bool {
    match name.strip_prefix(prefix).and_then(|r| r.strip_prefix(tag)) {
        Some(digits) => !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()),
        None => false,
    }
}

/// Split a node name `<prefix>-n<i>` into its prefix.
pub fn prefix_of(node: &str) -> Result<String> {
    let (prefix, _) = node
        .rsplit_once("-n")
        .with_context(|| format!("{node:?} is not a lab node name (like ml-n1)"))?;
    check_prefix(prefix)?;
    if !is_indexed(node, prefix, "-n") {
        bail!("{node:?} is not a lab node name (like ml-n1)");
    }
    Ok(prefix.to_string())
}

/// An IPv4 subnet such as 10.77.0.0/24.
#[derive(Clone, Copy, Debug)]
pub struct Subnet {
    pub network: u32,
    pub len: u8,
}

impl Subnet {
    pub fn parse(text: &str) -> Result<Subnet> {
        let (addr, len) = text.split_once('/').context("subnet must look like 10.77.0.0/24")?;
        let addr: Ipv4Addr = addr.parse().with_context(|| format!("bad address in {text:?}"))?;
        let len: u8 = len.parse().with_context(|| format!("bad prefix length in {text:?}"))?;
        if !(8..=28).contains(&len) {
            bail!("subnet prefix length must be 8 to 28, not {len}");
        }
        let mask = u32::MAX << (32 - len);
        Ok(Subnet { network: u32::from(addr) & mask, len })
    }

    pub fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.network | (u32::MAX >> self.len))
    }

    /// Node i (from 1) is host 10+i, leaving the low addresses free.
    pub fn node_addr(&self, i: usize) -> Result<Ipv4Addr> {
        let host = 10 + i as u32;
        if host >= (u32::MAX >> self.len) {
            bail!("subnet /{} has no room for node {i}", self.len);
        }
        Ok(Ipv4Addr::from(self.network + host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnet_addresses() {
        let s = Subnet::parse("10.77.0.0/24").unwrap();
        assert_eq!(s.node_addr(1).unwrap(), Ipv4Addr::new(10, 77, 0, 11));
        assert_eq!(s.broadcast(), Ipv4Addr::new(10, 77, 0, 255));
        assert!(s.node_addr(245).is_err());
    }

    #[test]
    fn node_names() {
        assert_eq!(prefix_of("ml-n3").unwrap(), "ml");
        assert!(prefix_of("ml-x").is_err());
        assert!(is_indexed("ml-n12", "ml", "-n"));
        assert!(!is_indexed("ml2-n1", "ml", "-n"));
        assert!(!is_indexed("ml-n", "ml", "-n"));
    }
}
