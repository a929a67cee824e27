//! Message bodies: a little writer and a checked reader, and each message's
//! fields in order. Every read checks the length first; every enum rejects
//! numbers it does not know.

use super::msg::*;
use super::CtrlError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub(super) struct W<'a> {
    pub buf: &'a mut [u8],
    pub at: usize,
}

impl W<'_> {
    pub fn bytes(&mut self, b: &[u8]) -> Result<(), CtrlError> {
        let end = self.at + b.len();
        if end > self.buf.len() {
            return Err(CtrlError::Limit { what: "datagram", got: end, limit: self.buf.len() });
        }
        self.buf[self.at..end].copy_from_slice(b);
        self.at = end;
        Ok(())
    }
    pub fn u8(&mut self, v: u8) -> Result<(), CtrlError> {
        self.bytes(&[v])
    }
    pub fn u32(&mut self, v: u32) -> Result<(), CtrlError> {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> Result<(), CtrlError> {
        self.bytes(&v.to_le_bytes())
    }
    pub fn addr(&mut self, a: &SocketAddr) -> Result<(), CtrlError> {
        let mut ip = [0u8; 16];
        let family = match a.ip() {
            IpAddr::V4(v4) => {
                ip[..4].copy_from_slice(&v4.octets());
                4
            }
            IpAddr::V6(v6) => {
                ip.copy_from_slice(&v6.octets());
                6
            }
        };
        self.u8(family)?;
        self.bytes(&ip)?;
        self.bytes(&a.port().to_le_bytes())
    }
}

pub(super) struct R<'a> {
    pub buf: &'a [u8],
    pub at: usize,
}

impl<'a> R<'a> {
    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CtrlError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(CtrlError::Truncated(what))?;
        let b = &self.buf[self.at..end];
        self.at = end;
        Ok(b)
    }
    pub fn u8(&mut self, what: &'static str) -> Result<u8, CtrlError> {
        Ok(self.bytes(1, what)?[0])
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, CtrlError> {
        Ok(u32::from_le_bytes(self.bytes(4, what)?.try_into().expect("4 bytes")))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, CtrlError> {
        Ok(u64::from_le_bytes(self.bytes(8, what)?.try_into().expect("8 bytes")))
    }
    pub fn bool(&mut self, what: &'static str) -> Result<bool, CtrlError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(CtrlError::BadField(what)),
        }
    }
    pub fn addr(&mut self, what: &'static str) -> Result<SocketAddr, CtrlError> {
        let family = self.u8(what)?;
        let ip: [u8; 16] = self.bytes(16, what)?.try_into().expect("16 bytes");
        let port = u16::from_le_bytes(self.bytes(2, what)?.try_into().expect("2 bytes"));
        let ip = match family {
            4 if ip[4..].iter().all(|&b| b == 0) => {
                IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]))
            }
            6 => IpAddr::V6(Ipv6Addr::from(ip)),
            _ => return Err(CtrlError::BadField(what)),
        };
        Ok(SocketAddr::new(ip, port))
    }
}

pub(super) fn class_from(v: u8) -> Result<NodeClass, CtrlError> {
    match v {
        0 => Ok(NodeClass::Neutral),
        1 => Ok(NodeClass::Server),
        2 => Ok(NodeClass::Client),
        _ => Err(CtrlError::BadField("class")),
    }
}

pub(super) fn reason_from(v: u8) -> Result<ReleaseReason, CtrlError> {
    match v {
        0 => Ok(ReleaseReason::Done),
        1 => Ok(ReleaseReason::Revoked),
        2 => Ok(ReleaseReason::Unknown),
        _ => Err(CtrlError::BadField("reason")),
    }
}

/// The wire number of each message type.
pub(super) fn type_of(b: &Body) -> u8 {
    match b {
        Body::Offer(_) => 1,
        Body::Request(_) => 2,
        Body::Grant(_) => 3,
        Body::Ack(_) => 4,
        Body::Reclaim(_) => 5,
        Body::Release(_) => 6,
        Body::Heartbeat(_) => 7,
    }
}

/// The header flags a body needs.
pub(super) fn flags_of(b: &Body) -> u16 {
    match b {
        Body::Heartbeat(h) => {
            let domain = if h.domain.is_empty() { 0 } else { FLAG_DOMAIN };
            let peers = if h.peers.is_empty() { 0 } else { FLAG_PEERS };
            domain | peers
        }
        _ => 0,
    }
}

pub(super) fn put(w: &mut W, b: &Body) -> Result<(), CtrlError> {
    match b {
        Body::Offer(o) => {
            w.u64(o.available_bytes)?;
            w.addr(&o.data_addr)?;
            w.u32(o.next_offer_ms)
        }
        Body::Request(r) => {
            w.u64(r.request_id)?;
            w.u64(r.bytes)?;
            w.u64(r.bytes_min)
        }
        Body::Grant(g) => {
            w.u64(g.request_id)?;
            w.u64(g.lease_id)?;
            w.u64(g.bytes)?;
            w.addr(&g.data_addr)?;
            w.bytes(&g.credential)?;
            w.u32(g.ack_within_ms)
        }
        Body::Ack(a) => {
            w.u64(a.request_id)?;
            w.u64(a.lease_id)?;
            w.u8(a.confirm as u8)
        }
        Body::Reclaim(r) => {
            w.u64(r.lease_id)?;
            w.u64(r.bytes)?;
            w.u32(r.deadline_ms)
        }
        Body::Release(r) => {
            w.u64(r.lease_id)?;
            w.u8(r.reason as u8)
        }
        Body::Heartbeat(h) => put_heartbeat(w, h),
    }
}

fn put_heartbeat(w: &mut W, h: &Heartbeat) -> Result<(), CtrlError> {
    if h.leases.len() > HEARTBEAT_LEASES_MAX {
        return Err(CtrlError::Limit {
            what: "heartbeat leases",
            got: h.leases.len(),
            limit: HEARTBEAT_LEASES_MAX,
        });
    }
    put_label(w, &h.name, "name bytes", NAME_BYTES_MAX)?;
    w.u8(h.class as u8)?;
    for v in [h.total_bytes, h.used_bytes, h.lent_bytes, h.borrowed_bytes, h.available_bytes] {
        w.u64(v)?;
    }
    w.addr(&h.data_addr)?;
    w.u8(h.leases.len() as u8)?;
    for l in &h.leases {
        w.u64(l.donor)?;
        w.u64(l.lease_id)?;
        w.u32(l.pages_per_s)?;
    }
    if !h.domain.is_empty() {
        put_label(w, &h.domain, "domain bytes", DOMAIN_BYTES_MAX)?;
    }
    if !h.peers.is_empty() {
        if h.peers.len() > HEARTBEAT_PEERS_MAX {
            return Err(CtrlError::Limit {
                what: "heartbeat peers",
                got: h.peers.len(),
                limit: HEARTBEAT_PEERS_MAX,
            });
        }
        w.u8(h.peers.len() as u8)?;
        for p in &h.peers {
            w.u64(p.node)?;
            w.addr(&p.ctrl_addr)?;
        }
    }
    Ok(())
}

/// A flagged peer list holds 1 to `HEARTBEAT_PEERS_MAX` peers.
fn get_peers(r: &mut R) -> Result<Vec<PeerAddr>, CtrlError> {
    let count = r.u8("peers")? as usize;
    if count == 0 {
        return Err(CtrlError::BadField("peers"));
    }
    if count > HEARTBEAT_PEERS_MAX {
        return Err(CtrlError::Limit {
            what: "heartbeat peers",
            got: count,
            limit: HEARTBEAT_PEERS_MAX,
        });
    }
    let mut peers = Vec::with_capacity(count);
    for _ in 0..count {
        peers.push(PeerAddr { node: r.u64("peer node")?, ctrl_addr: r.addr("peer address")? });
    }
    Ok(peers)
}

fn put_label(w: &mut W, s: &str, what: &'static str, limit: usize) -> Result<(), CtrlError> {
    if s.len() > limit {
        return Err(CtrlError::Limit { what, got: s.len(), limit });
    }
    w.u8(s.len() as u8)?;
    w.bytes(s.as_bytes())
}

fn get_label(r: &mut R, what: &'static str, limit: usize) -> Result<String, CtrlError> {
    let n = r.u8(what)? as usize;
    if n > limit {
        return Err(CtrlError::Limit { what, got: n, limit });
    }
    let s = std::str::from_utf8(r.bytes(n, what)?).map_err(|_| CtrlError::BadField(what))?;
    Ok(s.to_string())
}

/// Decode a body of type `kind` sent with header `flags`.
pub(super) fn get(r: &mut R, kind: u8, flags: u16) -> Result<Body, CtrlError> {
    let known = if kind == 7 { FLAG_DOMAIN | FLAG_PEERS } else { 0 };
    if flags & !known != 0 {
        return Err(CtrlError::BadFlags(flags.into()));
    }
    Ok(match kind {
        1 => Body::Offer(Offer {
            available_bytes: r.u64("available_bytes")?,
            data_addr: r.addr("data_addr")?,
            next_offer_ms: r.u32("next_offer_ms")?,
        }),
        2 => Body::Request(Request {
            request_id: r.u64("request_id")?,
            bytes: r.u64("bytes")?,
            bytes_min: r.u64("bytes_min")?,
        }),
        3 => Body::Grant(Grant {
            request_id: r.u64("request_id")?,
            lease_id: r.u64("lease_id")?,
            bytes: r.u64("bytes")?,
            data_addr: r.addr("data_addr")?,
            credential: r.bytes(16, "credential")?.try_into().expect("16 bytes"),
            ack_within_ms: r.u32("ack_within_ms")?,
        }),
        4 => Body::Ack(Ack {
            request_id: r.u64("request_id")?,
            lease_id: r.u64("lease_id")?,
            confirm: r.bool("confirm")?,
        }),
        5 => Body::Reclaim(Reclaim {
            lease_id: r.u64("lease_id")?,
            bytes: r.u64("bytes")?,
            deadline_ms: r.u32("deadline_ms")?,
        }),
        6 => Body::Release(Release {
            lease_id: r.u64("lease_id")?,
            reason: reason_from(r.u8("reason")?)?,
        }),
        7 => Body::Heartbeat(get_heartbeat(r, flags & FLAG_DOMAIN != 0, flags & FLAG_PEERS != 0)?),
        other => return Err(CtrlError::UnknownType(other)),
    })
}

fn get_heartbeat(r: &mut R, has_domain: bool, has_peers: bool) -> Result<Heartbeat, CtrlError> {
    let name = get_label(r, "name bytes", NAME_BYTES_MAX)?;
    let class = class_from(r.u8("class")?)?;
    let (total_bytes, used_bytes) = (r.u64("total_bytes")?, r.u64("used_bytes")?);
    let (lent_bytes, borrowed_bytes) = (r.u64("lent_bytes")?, r.u64("borrowed_bytes")?);
    let available_bytes = r.u64("available_bytes")?;
    let data_addr = r.addr("data_addr")?;
    let count = r.u8("leases")? as usize;
    if count > HEARTBEAT_LEASES_MAX {
        return Err(CtrlError::Limit {
            what: "heartbeat leases",
            got: count,
            limit: HEARTBEAT_LEASES_MAX,
        });
    }
    let mut leases = Vec::with_capacity(count);
    for _ in 0..count {
        leases.push(LeaseReport {
            donor: r.u64("donor")?,
            lease_id: r.u64("lease_id")?,
            pages_per_s: r.u32("pages_per_s")?,
        });
    }
    let domain = if has_domain {
        let d = get_label(r, "domain bytes", DOMAIN_BYTES_MAX)?;
        if d.is_empty() {
            return Err(CtrlError::BadField("domain"));
        }
        d
    } else {
        String::new()
    };
    let peers = if has_peers { get_peers(r)? } else { Vec::new() };
    Ok(Heartbeat {
        peers,
        domain,
        name,
        class,
        total_bytes,
        used_bytes,
        lent_bytes,
        borrowed_bytes,
        available_bytes,
        data_addr,
        leases,
    })
}
