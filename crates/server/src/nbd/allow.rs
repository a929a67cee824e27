//! Which client addresses may use the NBD export. NBD has no authentication
//! of its own, so anything off loopback must be named.

use std::net::IpAddr;
use std::str::FromStr;

/// An address block: `10.0.0.0/8`, `192.168.1.5` (one host), `fd00::/8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix_len: u8,
}

impl Cidr {
    /// Whether `ip` is inside the block. An IPv4 client that reaches an
    /// IPv6 socket (`::ffff:a.b.c.d`) is matched as IPv4.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                same_prefix(u32::from(net).into(), u32::from(ip).into(), self.prefix_len, 32)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                same_prefix(u128::from(net), u128::from(ip), self.prefix_len, 128)
            }
            _ => false,
        }
    }
}

/// Whether the top `len` of `bits` bits agree.
fn same_prefix(a: u128, b: u128, len: u8, bits: u32) -> bool {
    let shift = bits - u32::from(len);
    len == 0 || (a >> shift) == (b >> shift)
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Cidr, String> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| format!("{s:?}: not an address block"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_len = match len {
            None => max,
            Some(l) => {
                l.parse().ok().filter(|&l| l <= max).ok_or(format!("{s:?}: bad prefix length"))?
            }
        };
        Ok(Cidr { addr, prefix_len })
    }
}

/// Whether `ip` may connect: every address when `allow` is empty.
pub fn allowed(allow: &[Cidr], ip: IpAddr) -> bool {
    allow.is_empty() || allow.iter().any(|c| c.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_contain_what_they_should() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(c("10.0.0.0/8").contains(ip("10.200.3.4")));
        assert!(!c("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(c("192.168.1.5").contains(ip("192.168.1.5")));
        assert!(!c("192.168.1.5").contains(ip("192.168.1.6")));
        assert!(c("0.0.0.0/0").contains(ip("8.8.8.8")));
        assert!(c("10.0.0.0/8").contains(ip("::ffff:10.1.2.3")));
        assert!(c("fd00::/8").contains(ip("fd12::1")));
        assert!(!c("fd00::/8").contains(ip("10.0.0.1")));
        assert!(allowed(&[], ip("1.2.3.4")));
        assert!(!allowed(&[c("127.0.0.1")], ip("1.2.3.4")));
    }

    #[test]
    fn bad_blocks_are_refused() {
        for bad in ["10.0.0.0/33", "fd00::/129", "10.0.0/8", "x", "10.0.0.0/-1", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
