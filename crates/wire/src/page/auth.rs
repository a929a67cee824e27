//! The cluster key and the handshake MACs (HMAC-SHA256).
//!
//! Both sides bind both nonces, the borrower id and the session into the MAC,
//! with a different label per direction, so a MAC can be neither replayed on
//! another connection nor reflected back to its sender.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const KEY_LEN: usize = 32;
pub const MAC_LEN: usize = 32;
/// Each side's nonce in the handshake (`hello.rs`), which the MACs cover.
pub const NONCE_LEN: usize = 32;

/// The cluster key. Its `Debug` never prints the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_LEN]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

impl Key {
    pub fn from_bytes(b: [u8; KEY_LEN]) -> Self {
        Key(b)
    }

    /// Parse the key file's text: 64 hex digits, surrounding white space
    /// allowed. The error never echoes the input.
    pub fn from_hex(text: &str) -> Result<Self, &'static str> {
        let t = text.trim();
        if t.len() != KEY_LEN * 2 {
            return Err("a key is 64 hex digits");
        }
        let mut out = [0u8; KEY_LEN];
        for (i, pair) in t.as_bytes().chunks_exact(2).enumerate() {
            let hex = std::str::from_utf8(pair).map_err(|_| "a key is 64 hex digits")?;
            out[i] = u8::from_str_radix(hex, 16).map_err(|_| "a key is 64 hex digits")?;
        }
        Ok(Key(out))
    }

    /// The raw key, for deriving other keys from it (the control protocol's).
    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(label);
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }
}

/// The MAC a client sends in AUTH.
pub fn client_mac(
    key: &Key,
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
    borrower_id: &[u8; 16],
    resume_session: u64,
) -> [u8; MAC_LEN] {
    let session = resume_session.to_le_bytes();
    key.mac(b"memlend/v1/client", &[client_nonce, server_nonce, borrower_id, &session])
}

/// The MAC a server sends in WELCOME; it covers the resumed sequence
/// number too, so nobody on the path can make a client skip requests.
pub fn server_mac(
    key: &Key,
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
    borrower_id: &[u8; 16],
    (session_id, resumed_seq): (u64, u64),
) -> [u8; MAC_LEN] {
    let (session, resumed) = (session_id.to_le_bytes(), resumed_seq.to_le_bytes());
    key.mac(b"memlend/v1/server", &[server_nonce, client_nonce, borrower_id, &session, &resumed])
}

/// Constant-time comparison, so timing does not leak how much of a forged
/// MAC was right: the hmac crate's own (`CtOutput`, subtle's
/// `ConstantTimeEq`), not a fold of our own that an optimizer may turn
/// into an early exit.
pub fn verify_mac(expected: &[u8; MAC_LEN], got: &[u8; MAC_LEN]) -> bool {
    type Out = hmac::digest::CtOutput<Hmac<Sha256>>;
    Out::new((*expected).into()) == Out::new((*got).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_bind_direction_nonces_and_key() {
        let k = Key::from_bytes([7; 32]);
        let (cn, sn, id) = ([1; 32], [2; 32], [3; 16]);
        let c = client_mac(&k, &cn, &sn, &id, 0);
        assert!(verify_mac(&c, &client_mac(&k, &cn, &sn, &id, 0)));
        assert!(!verify_mac(&c, &server_mac(&k, &cn, &sn, &id, (0, 0))));
        assert!(!verify_mac(&c, &client_mac(&k, &sn, &cn, &id, 0)));
        assert!(!verify_mac(&c, &client_mac(&Key::from_bytes([8; 32]), &cn, &sn, &id, 0)));
        assert!(!verify_mac(&c, &client_mac(&k, &cn, &sn, &[4; 16], 0)));
        assert!(!verify_mac(&c, &client_mac(&k, &cn, &sn, &id, 1)));
    }

    #[test]
    fn hex_keys_parse_and_bad_ones_do_not() {
        let k = Key::from_bytes([0xab; 32]);
        assert_eq!(Key::from_hex(&format!(" {}\n", k.to_hex())).unwrap(), k);
        assert!(Key::from_hex("abc").is_err());
        assert!(Key::from_hex(&"zz".repeat(32)).is_err());
        assert!(Key::from_hex(&"é".repeat(32)).is_err());
        assert_eq!(format!("{k:?}"), "Key(<redacted>)");
    }
}
