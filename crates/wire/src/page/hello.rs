//! The handshake: HELLO, CHALLENGE, AUTH, WELCOME.
//!
//! The client names itself (borrower id) and a nonce; the server answers with
//! its own nonce; each side proves it holds the cluster key with an HMAC over
//! both nonces (see `auth.rs`). Only then does the server read requests.

use super::auth::{MAC_LEN, NONCE_LEN};
use super::{le_u16, le_u32, le_u64, FrameError, Status};

fn check_magic(b: &[u8], len: usize, magic: &[u8; 8]) -> Result<(), FrameError> {
    if b.len() < len {
        return Err(FrameError::Truncated { got: b.len(), need: len });
    }
    let got = le_u64(b, 0);
    if got != u64::from_le_bytes(*magic) {
        return Err(FrameError::BadMagic(got));
    }
    Ok(())
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b[at..at + N].try_into().expect("sized by caller")
}

/// Client → server, 72 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub version_min: u16,
    pub version_max: u16,
    /// Who is borrowing: slabs belong to this id, and only a connection that
    /// authenticates with it can name them.
    pub borrower_id: [u8; 16],
    pub client_nonce: [u8; NONCE_LEN],
    /// A session to resume after a reconnect, or 0 for a new one.
    pub resume_session: u64,
}

impl Hello {
    pub const LEN: usize = 72;
    const MAGIC: &'static [u8; 8] = b"MLNDHELO";

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(Self::MAGIC);
        b[8..10].copy_from_slice(&self.version_min.to_le_bytes());
        b[10..12].copy_from_slice(&self.version_max.to_le_bytes());
        b[16..32].copy_from_slice(&self.borrower_id);
        b[32..64].copy_from_slice(&self.client_nonce);
        b[64..72].copy_from_slice(&self.resume_session.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FrameError> {
        check_magic(b, Self::LEN, Self::MAGIC)?;
        let flags = le_u32(b, 12);
        if flags != 0 {
            return Err(FrameError::BadFlags(flags));
        }
        Ok(Hello {
            version_min: le_u16(b, 8),
            version_max: le_u16(b, 10),
            borrower_id: array(b, 16),
            client_nonce: array(b, 32),
            resume_session: le_u64(b, 64),
        })
    }
}

/// Server → client, 48 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub version: u16,
    /// The server runs without a key (`--insecure`): no MACs are checked.
    pub insecure: bool,
    pub server_nonce: [u8; NONCE_LEN],
}

impl Challenge {
    pub const LEN: usize = 48;
    const MAGIC: &'static [u8; 8] = b"MLNDCHAL";
    const FLAG_INSECURE: u16 = 1;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(Self::MAGIC);
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        let flags = if self.insecure { Self::FLAG_INSECURE } else { 0 };
        b[10..12].copy_from_slice(&flags.to_le_bytes());
        b[16..48].copy_from_slice(&self.server_nonce);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FrameError> {
        check_magic(b, Self::LEN, Self::MAGIC)?;
        let flags = le_u16(b, 10);
        if flags & !Self::FLAG_INSECURE != 0 {
            return Err(FrameError::BadFlags(flags as u32));
        }
        Ok(Challenge {
            version: le_u16(b, 8),
            insecure: flags & Self::FLAG_INSECURE != 0,
            server_nonce: array(b, 16),
        })
    }
}

/// Client → server, 48 bytes: the client's proof of the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Auth {
    pub mac: [u8; MAC_LEN],
}

impl Auth {
    pub const LEN: usize = 48;
    const MAGIC: &'static [u8; 8] = b"MLNDAUTH";

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(Self::MAGIC);
        b[8..40].copy_from_slice(&self.mac);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FrameError> {
        check_magic(b, Self::LEN, Self::MAGIC)?;
        Ok(Auth { mac: array(b, 8) })
    }
}

/// Server → client, 80 bytes: the verdict, the server's proof of the key,
/// the limits the client must respect on this connection, and, on a resumed
/// session, the last request the session applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Welcome {
    pub status: Status,
    pub mac: [u8; MAC_LEN],
    pub batch_pages_max: u32,
    pub inflight_max: u32,
    pub session_id: u64,
    /// Pages this donor lends in all (a hint for the client's placement).
    pub lend_pages: u64,
    /// On a resume: the session's last applied sequence number (0 on a new
    /// session). The client sends again every request it has no reply for.
    pub resumed_seq: u64,
}

impl Welcome {
    pub const LEN: usize = 80;
    const MAGIC: &'static [u8; 8] = b"MLNDWELC";

    pub fn refused(status: Status) -> Self {
        Welcome {
            status,
            mac: [0; MAC_LEN],
            batch_pages_max: 0,
            inflight_max: 0,
            session_id: 0,
            lend_pages: 0,
            resumed_seq: 0,
        }
    }

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(Self::MAGIC);
        b[8..10].copy_from_slice(&(self.status as u16).to_le_bytes());
        b[16..48].copy_from_slice(&self.mac);
        b[48..52].copy_from_slice(&self.batch_pages_max.to_le_bytes());
        b[52..56].copy_from_slice(&self.inflight_max.to_le_bytes());
        b[56..64].copy_from_slice(&self.session_id.to_le_bytes());
        b[64..72].copy_from_slice(&self.lend_pages.to_le_bytes());
        b[72..80].copy_from_slice(&self.resumed_seq.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FrameError> {
        check_magic(b, Self::LEN, Self::MAGIC)?;
        Ok(Welcome {
            status: Status::from_u16(le_u16(b, 8)),
            mac: array(b, 16),
            batch_pages_max: le_u32(b, 48),
            inflight_max: le_u32(b, 52),
            session_id: le_u64(b, 56),
            lend_pages: le_u64(b, 64),
            resumed_seq: le_u64(b, 72),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hello_round_trips(min: u16, max: u16, id: [u8; 16], nonce: [u8; 32], resume: u64) {
            let h = Hello { version_min: min, version_max: max, borrower_id: id, client_nonce: nonce, resume_session: resume };
            prop_assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        }

        #[test]
        fn challenge_round_trips(version: u16, insecure: bool, nonce: [u8; 32]) {
            let c = Challenge { version, insecure, server_nonce: nonce };
            prop_assert_eq!(Challenge::decode(&c.encode()).unwrap(), c);
        }

        #[test]
        fn auth_and_welcome_round_trip(mac: [u8; 32], batch: u32, inflight: u32, session: u64, lend: u64, resumed: u64) {
            let a = Auth { mac };
            prop_assert_eq!(Auth::decode(&a.encode()).unwrap(), a);
            let w = Welcome { status: Status::Ok, mac, batch_pages_max: batch, inflight_max: inflight, session_id: session, lend_pages: lend, resumed_seq: resumed };
            prop_assert_eq!(Welcome::decode(&w.encode()).unwrap(), w);
        }

        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = Hello::decode(&b);
            let _ = Challenge::decode(&b);
            let _ = Auth::decode(&b);
            let _ = Welcome::decode(&b);
        }
    }

    #[test]
    fn short_and_foreign_frames_are_refused() {
        assert!(matches!(Hello::decode(&[0u8; 10]), Err(FrameError::Truncated { .. })));
        assert!(matches!(Hello::decode(&[0u8; 72]), Err(FrameError::BadMagic(_))));
        let wrong = Challenge { version: 1, insecure: false, server_nonce: [0; 32] }.encode();
        assert!(matches!(
            Hello::decode(&[&wrong[..], &[0u8; 24]].concat()),
            Err(FrameError::BadMagic(_))
        ));
    }
}
