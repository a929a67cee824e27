//! One datagram: a 44-byte header, the body, a 16-byte MAC.
//!
//! ```text
//!  0 magic "MLCT"   4 version u8   5 type u8   6 flags u16 (FLAG_DOMAIN, FLAG_PEERS)
//!  8 cluster_id u64   16 sender u64   24 incarnation u64   32 counter u64
//! 40 body_len u16   42 reserved u16 (0)   44 body   44+body_len mac[16]
//! ```
//! The MAC covers every byte before it and is checked before the body is
//! parsed: an unauthenticated datagram never reaches the body parser.

use super::auth::{CtrlKey, CTRL_MAC_BYTES};
use super::body::{flags_of, get, put, type_of, R, W};
use super::msg::{Envelope, CTRL_VERSION, DATAGRAM_BYTES_MAX};
use super::CtrlError;

pub const CTRL_MAGIC: [u8; 4] = *b"MLCT";
pub const CTRL_HEADER_BYTES: usize = 44;
/// The shortest datagram: a header, an empty body, a MAC.
pub const DATAGRAM_BYTES_MIN: usize = CTRL_HEADER_BYTES + CTRL_MAC_BYTES;

/// Encode, sign, and return the datagram's length in `out` (which must hold
/// [`DATAGRAM_BYTES_MAX`]). Refuses what the decoder would refuse.
pub fn encode(env: &Envelope, key: &CtrlKey, out: &mut [u8]) -> Result<usize, CtrlError> {
    if env.counter == 0 {
        return Err(CtrlError::BadField("counter"));
    }
    let limit = out.len().min(DATAGRAM_BYTES_MAX);
    let buf = &mut out[..limit];
    let mut w = W { buf, at: 0 };
    w.bytes(&CTRL_MAGIC)?;
    w.u8(CTRL_VERSION)?;
    w.u8(type_of(&env.body))?;
    w.bytes(&flags_of(&env.body).to_le_bytes())?;
    for v in [env.cluster_id, env.sender, env.incarnation, env.counter] {
        w.u64(v)?;
    }
    w.bytes(&[0; 4])?; // body_len, filled below; reserved
    put(&mut w, &env.body)?;
    let body_len = w.at - CTRL_HEADER_BYTES;
    let end = w.at;
    if end + CTRL_MAC_BYTES > limit {
        return Err(CtrlError::Limit { what: "datagram", got: end + CTRL_MAC_BYTES, limit });
    }
    out[40..42].copy_from_slice(&(body_len as u16).to_le_bytes());
    let mac = key.mac(&out[..end]);
    out[end..end + CTRL_MAC_BYTES].copy_from_slice(&mac);
    Ok(end + CTRL_MAC_BYTES)
}

/// Check and decode one datagram. The caller still checks the cluster id
/// and the replay window.
pub fn decode(d: &[u8], key: &CtrlKey) -> Result<Envelope, CtrlError> {
    if d.len() < DATAGRAM_BYTES_MIN {
        return Err(CtrlError::TooShort { got: d.len(), need: DATAGRAM_BYTES_MIN });
    }
    if d.len() > DATAGRAM_BYTES_MAX {
        return Err(CtrlError::TooLong { got: d.len(), limit: DATAGRAM_BYTES_MAX });
    }
    if d[..4] != CTRL_MAGIC {
        return Err(CtrlError::BadMagic(u32::from_le_bytes(d[..4].try_into().expect("4 bytes"))));
    }
    if d[4] != CTRL_VERSION {
        return Err(CtrlError::Version(d[4]));
    }
    let signed = d.len() - CTRL_MAC_BYTES;
    if !key.verify(&d[..signed], &d[signed..]) {
        return Err(CtrlError::BadMac);
    }
    let mut r = R { buf: &d[..signed], at: 5 };
    let kind = r.u8("type")?;
    let flags = u16::from_le_bytes(r.bytes(2, "flags")?.try_into().expect("2 bytes"));
    let (cluster_id, sender) = (r.u64("cluster_id")?, r.u64("sender")?);
    let (incarnation, counter) = (r.u64("incarnation")?, r.u64("counter")?);
    let body_len =
        u16::from_le_bytes(r.bytes(2, "body_len")?.try_into().expect("2 bytes")) as usize;
    let reserved = u16::from_le_bytes(r.bytes(2, "reserved")?.try_into().expect("2 bytes"));
    if reserved != 0 {
        return Err(CtrlError::BadFlags(reserved.into()));
    }
    if body_len != signed - CTRL_HEADER_BYTES {
        return Err(CtrlError::BodyLength {
            declared: body_len,
            actual: signed - CTRL_HEADER_BYTES,
        });
    }
    if counter == 0 {
        return Err(CtrlError::BadField("counter"));
    }
    let body = get(&mut r, kind, flags)?;
    if r.at != signed {
        return Err(CtrlError::Trailing(signed - r.at));
    }
    Ok(Envelope { cluster_id, sender, incarnation, counter, body })
}
