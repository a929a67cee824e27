//! The server's side of HELLO / CHALLENGE / AUTH / WELCOME.

use super::sessions::{ResumeError, Session, Sessions};
use memlend_wire::page::{self, Auth, Challenge, Hello, Key, Status, Welcome};
use std::io::{self, Read, Write};
use std::sync::Arc;

/// What a successful handshake establishes for the connection: its session
/// (new or resumed) and the epoch that this connection holds it in.
pub struct Accepted {
    pub borrower_id: [u8; 16],
    pub session: Arc<Session>,
    pub epoch: u64,
    pub resumed_seq: u64,
}

/// Limits the server announces in WELCOME.
pub struct Offer {
    pub batch_pages_max: u32,
    pub inflight_max: u32,
    pub lend_pages: u64,
}

/// Why a handshake failed; logged by the caller with the peer's address.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("peer closed before sending HELLO")]
    Silent,
    #[error("I/O during handshake: {0}")]
    Io(#[from] io::Error),
    #[error("malformed handshake frame: {0}")]
    Frame(#[from] page::FrameError),
    #[error("client speaks versions {min}..={max}, this server speaks {}", page::VERSION)]
    Version { min: u16, max: u16 },
    #[error("wrong cluster key (authentication failed)")]
    AuthFailed,
    #[error("cannot resume session {id:#x}: {why}")]
    Resume { id: u64, why: ResumeError },
}

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).expect("the kernel's random source is available");
    b
}

/// Run the handshake on `stream`. With `key == None` the server is insecure:
/// it says so in CHALLENGE and accepts any AUTH.
pub fn accept<S: Read + Write>(
    stream: &mut S,
    key: Option<&Key>,
    offer: &Offer,
    sessions: &Sessions,
) -> Result<Accepted, HandshakeError> {
    let mut buf = [0u8; Hello::LEN];
    let mut first = [0u8; 1];
    if stream.read(&mut first)? == 0 {
        return Err(HandshakeError::Silent);
    }
    buf[0] = first[0];
    stream.read_exact(&mut buf[1..])?;
    let hello = Hello::decode(&buf)?;
    if !(hello.version_min..=hello.version_max).contains(&page::VERSION) {
        stream.write_all(&Welcome::refused(Status::VersionUnsupported).encode())?;
        return Err(HandshakeError::Version { min: hello.version_min, max: hello.version_max });
    }
    let server_nonce = random::<{ page::NONCE_LEN }>();
    let challenge = Challenge { version: page::VERSION, insecure: key.is_none(), server_nonce };
    stream.write_all(&challenge.encode())?;

    let mut buf = [0u8; Auth::LEN];
    stream.read_exact(&mut buf)?;
    let auth = Auth::decode(&buf)?;
    let id = hello.borrower_id;
    if let Some(key) = key {
        let expected =
            page::client_mac(key, &hello.client_nonce, &server_nonce, &id, hello.resume_session);
        if !page::verify_mac(&expected, &auth.mac) {
            stream.write_all(&Welcome::refused(Status::AuthFailed).encode())?;
            return Err(HandshakeError::AuthFailed);
        }
    }
    let resume = hello.resume_session;
    let taken = match resume {
        0 => sessions.create(u64::from_le_bytes(random::<8>()) | 1, id).map(|(s, e)| (s, e, 0)),
        _ => sessions.resume(resume, id),
    };
    let (session, epoch, resumed_seq) = match taken {
        Ok(t) => t,
        Err(why) => {
            let status = match why {
                ResumeError::Unknown => Status::NoSession,
                ResumeError::Full => Status::TooManyConnections,
            };
            stream.write_all(&Welcome::refused(status).encode())?;
            return Err(HandshakeError::Resume { id: resume, why });
        }
    };
    let seqs = (session.id, resumed_seq);
    let mac = key.map_or([0; page::MAC_LEN], |k| {
        page::server_mac(k, &hello.client_nonce, &server_nonce, &id, seqs)
    });
    let welcome = Welcome {
        status: Status::Ok,
        mac,
        batch_pages_max: offer.batch_pages_max,
        inflight_max: offer.inflight_max,
        session_id: session.id,
        lend_pages: offer.lend_pages,
        resumed_seq,
    };
    if let Err(e) = stream.write_all(&welcome.encode()) {
        session.detach(epoch);
        return Err(e.into());
    }
    Ok(Accepted { borrower_id: id, session, epoch, resumed_seq })
}
