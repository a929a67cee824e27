//! The control protocol's MAC. Its key is derived from the cluster key with
//! its own label, so the page protocol and the control protocol never share
//! a MAC key (a MAC valid in one can never be replayed into the other).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of MAC at the end of every datagram: HMAC-SHA256 truncated to 128
/// bits (RFC 2104 section 5 allows it; forging still needs ~2^128 tries).
pub const CTRL_MAC_BYTES: usize = 16;

/// The control MAC key. Its `Debug` never prints the bytes.
#[derive(Clone)]
pub struct CtrlKey([u8; 32]);

impl std::fmt::Debug for CtrlKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CtrlKey(<redacted>)")
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

impl CtrlKey {
    pub fn new(cluster_key: &[u8; 32]) -> CtrlKey {
        CtrlKey(hmac(cluster_key, &[b"memlend/v1/ctrl-key"]))
    }

    /// For clusters run with `--insecure`: a fixed key. It catches
    /// corruption, not forgery.
    pub fn insecure() -> CtrlKey {
        CtrlKey::new(&[0; 32])
    }

    pub fn mac(&self, signed: &[u8]) -> [u8; CTRL_MAC_BYTES] {
        let full = hmac(&self.0, &[b"memlend/v1/ctrl", signed]);
        let mut out = [0u8; CTRL_MAC_BYTES];
        out.copy_from_slice(&full[..CTRL_MAC_BYTES]);
        out
    }

    /// Constant time, so timing does not tell how much of a forgery was right.
    pub fn verify(&self, signed: &[u8], mac: &[u8]) -> bool {
        let want = self.mac(signed);
        mac.len() == CTRL_MAC_BYTES
            && want.iter().zip(mac).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// A cluster's id, from its key: nodes with different keys never mistake
/// each other's datagrams for their own cluster's.
pub fn cluster_id_from_key(cluster_key: &[u8; 32]) -> u64 {
    let h = hmac(cluster_key, &[b"memlend/v1/cluster-id"]);
    u64::from_le_bytes(h[..8].try_into().expect("8 bytes"))
}
