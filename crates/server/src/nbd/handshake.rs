//! Fixed-newstyle negotiation: greeting, client flags, then options until
//! the client picks an export (OPT_EXPORT_NAME or OPT_GO) or gives up.
//! Every option is bounded: its data by `option_bytes_max` (larger data is
//! skipped, never allocated), their number by `options_per_handshake_max`.

use super::error::ConnError;
use super::export::ExportState;
use super::meta_context;
use super::peer::Peer;
use super::server::Server;
use super::session::Session;
use memlend_wire::nbd::{
    client_flags, encode_export_name_reply, encode_opt_reply, encode_rep_server,
};
use memlend_wire::nbd::{
    handshake_flags, info, opt, rep, ClientFlags, Greeting, Info, InfoRequest,
};
use memlend_wire::nbd::{OptHeader, CLIENT_FLAGS_LEN, OPT_HEADER_LEN};
use std::io::{self, Read, Write};
use std::sync::Arc;

/// Bytes thrown away per `read` when skipping oversize option data.
const SKIP_CHUNK_BYTES: usize = 16 << 10;

pub(crate) enum Negotiated {
    Transmit(Session),
    /// The client sent OPT_ABORT.
    Aborted,
    /// STARTTLS was acknowledged: run the TLS handshake, then go on with
    /// `haggle` inside it.
    StartTls(Haggle),
}

/// Where the option haggling stands, carried across STARTTLS.
pub(crate) struct Haggle {
    flags: ClientFlags,
    options_left: u32,
    tls: bool,
}

struct State {
    flags: ClientFlags,
    structured: bool,
    /// Options go over TLS now.
    tls: bool,
    /// The export `base:allocation` was selected for by the last
    /// SET_META_CONTEXT, if any.
    meta: Option<Arc<ExportState>>,
}

/// Greet the client, read its flags, and haggle over options.
pub(crate) fn negotiate<S: Read + Write>(
    io: &mut S,
    server: &Server,
    peer: Peer,
) -> Result<Negotiated, ConnError> {
    let flags = handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES;
    io.write_all(&Greeting { handshake_flags: flags }.encode())?;
    let mut b = [0u8; CLIENT_FLAGS_LEN];
    io.read_exact(&mut b)?;
    let offered = client_flags::C_FIXED_NEWSTYLE | client_flags::C_NO_ZEROES;
    let flags = ClientFlags::decode(&b, offered)?;
    let options_left = server.cfg.options_per_handshake_max;
    haggle(io, server, peer, Haggle { flags, options_left, tls: false })
}

/// Options until the client picks an export, aborts or starts TLS. The
/// limit on options counts those before STARTTLS too. Nothing negotiated
/// before TLS (structured replies) carries over, as the protocol asks.
pub(crate) fn haggle<S: Read + Write>(
    io: &mut S,
    server: &Server,
    peer: Peer,
    mut h: Haggle,
) -> Result<Negotiated, ConnError> {
    let mut st = State { flags: h.flags, structured: false, tls: h.tls, meta: None };
    while h.options_left > 0 {
        h.options_left -= 1;
        let mut b = [0u8; OPT_HEADER_LEN];
        io.read_exact(&mut b)?;
        match one_option(io, server, &mut st, OptHeader::decode(&b)?, peer)? {
            Some(Negotiated::StartTls(_)) => {
                return Ok(Negotiated::StartTls(Haggle { tls: true, ..h }));
            }
            Some(done) => return Ok(done),
            None => {}
        }
    }
    Err(ConnError::TooManyOptions { limit: server.cfg.options_per_handshake_max })
}

fn one_option<S: Read + Write>(
    io: &mut S,
    server: &Server,
    st: &mut State,
    h: OptHeader,
    peer: Peer,
) -> Result<Option<Negotiated>, ConnError> {
    if !st.flags.fixed_newstyle && h.option != opt::EXPORT_NAME {
        return Err(ConnError::NotFixedNewstyle(h.option));
    }
    let limit_bytes = server.cfg.option_bytes_max;
    if h.len > limit_bytes {
        if h.option == opt::EXPORT_NAME {
            return Err(ConnError::ExportNameTooLong { len_bytes: h.len, limit_bytes });
        }
        skip(io, h.len as u64)?;
        let mut out = Vec::new();
        encode_opt_reply(&mut out, h.option, rep::ERR_TOO_BIG, b"option data too long");
        io.write_all(&out)?;
        return Ok(None);
    }
    let mut data = vec![0u8; h.len as usize];
    io.read_exact(&mut data)?;
    let mut out = Vec::new();
    let done = answer(&mut out, server, st, h.option, &data, peer)?;
    if let Some(Negotiated::Aborted) = done {
        let _ = io.write_all(&out); // the client may already be gone
    } else {
        io.write_all(&out)?;
    }
    if server.shutdown.is_stopping() && done.is_none() {
        return Err(ConnError::ShuttingDown);
    }
    Ok(done)
}

/// Encode the answer to one option into `out`; `Some` ends negotiation.
fn answer(
    out: &mut Vec<u8>,
    server: &Server,
    st: &mut State,
    option: u32,
    data: &[u8],
    peer: Peer,
) -> Result<Option<Negotiated>, ConnError> {
    if server.shutdown.is_stopping() && option != opt::ABORT {
        encode_opt_reply(out, option, rep::ERR_SHUTDOWN, b"server is shutting down");
        return Ok(None);
    }
    let tls_first = server.cfg.tls.is_some() && !st.tls;
    match option {
        opt::ABORT => {
            encode_opt_reply(out, option, rep::ACK, &[]);
            return Ok(Some(Negotiated::Aborted));
        }
        opt::STARTTLS => return Ok(starttls(out, server, st, data)),
        opt::EXPORT_NAME if tls_first => return Err(ConnError::TlsRequired),
        _ if tls_first => encode_opt_reply(
            out,
            option,
            rep::ERR_TLS_REQD,
            b"this server requires TLS: send NBD_OPT_STARTTLS first",
        ),
        opt::EXPORT_NAME => return export_name(out, server, st, data, peer).map(Some),
        opt::LIST if data.is_empty() => list(out, server),
        opt::STRUCTURED_REPLY if data.is_empty() => {
            st.structured = true;
            encode_opt_reply(out, option, rep::ACK, &[]);
        }
        opt::LIST | opt::STRUCTURED_REPLY => {
            encode_opt_reply(out, option, rep::ERR_INVALID, b"this option takes no data")
        }
        opt::INFO | opt::GO => return Ok(info_or_go(out, server, st, option, data, peer)),
        opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
            meta_context::answer(out, server, st.structured, &mut st.meta, option, data)
        }
        _ => encode_opt_reply(out, option, rep::ERR_UNSUP, b"option not supported by memlend"),
    }
    Ok(None)
}

/// Acknowledge STARTTLS if TLS is configured and not on yet.
fn starttls(out: &mut Vec<u8>, server: &Server, st: &State, data: &[u8]) -> Option<Negotiated> {
    let refuse = |out: &mut Vec<u8>, code, why: &[u8]| {
        encode_opt_reply(out, opt::STARTTLS, code, why);
        None
    };
    if !data.is_empty() {
        return refuse(out, rep::ERR_INVALID, b"this option takes no data");
    }
    if server.cfg.tls.is_none() {
        return refuse(out, rep::ERR_UNSUP, b"TLS is not configured on this server");
    }
    if st.tls {
        return refuse(out, rep::ERR_INVALID, b"TLS is already on");
    }
    encode_opt_reply(out, opt::STARTTLS, rep::ACK, &[]);
    // The caller fills in where the haggling stands.
    let placeholder = Haggle { flags: st.flags, options_left: 0, tls: true };
    Some(Negotiated::StartTls(placeholder))
}

/// OPT_EXPORT_NAME has no error reply: an unknown name ends the connection.
fn export_name(
    out: &mut Vec<u8>,
    server: &Server,
    st: &State,
    name: &[u8],
    peer: Peer,
) -> Result<Negotiated, ConnError> {
    let unknown = || ConnError::UnknownExport(String::from_utf8_lossy(name).into_owned());
    let export = server.find(name).ok_or_else(unknown)?;
    let flags = export.tx_flags(st.structured);
    encode_export_name_reply(out, export.size_bytes, flags, st.flags.no_zeroes);
    Ok(transmit(server, st, export, peer))
}

/// Enter transmission on `export`, with block status if `base:allocation`
/// was selected for this very export (a selection belongs to the export
/// SET_META_CONTEXT named).
fn transmit(server: &Server, st: &State, export: &Arc<ExportState>, peer: Peer) -> Negotiated {
    let block_status = st.meta.as_ref().is_some_and(|m| Arc::ptr_eq(m, export));
    let session = Session::new(Arc::clone(export), st.structured, block_status, peer, &server.cfg);
    Negotiated::Transmit(session)
}

fn list(out: &mut Vec<u8>, server: &Server) {
    for e in &server.exports {
        encode_opt_reply(
            out,
            opt::LIST,
            rep::SERVER,
            &encode_rep_server(e.name.as_bytes(), e.description.as_bytes()),
        );
    }
    encode_opt_reply(out, opt::LIST, rep::ACK, &[]);
}

fn info_or_go(
    out: &mut Vec<u8>,
    server: &Server,
    st: &State,
    option: u32,
    data: &[u8],
    peer: Peer,
) -> Option<Negotiated> {
    let req = match InfoRequest::decode(data) {
        Ok(r) => r,
        Err(e) => {
            encode_opt_reply(out, option, rep::ERR_INVALID, e.to_string().as_bytes());
            return None;
        }
    };
    let Some(export) = server.find(req.name) else {
        encode_opt_reply(out, option, rep::ERR_UNKNOWN, b"no such export");
        return None;
    };
    for item in info_items(export, st.structured, &req.requests, server) {
        encode_opt_reply(out, option, rep::INFO, &item.encode());
    }
    encode_opt_reply(out, option, rep::ACK, &[]);
    let go = option == opt::GO;
    go.then(|| transmit(server, st, export, peer))
}

/// INFO_EXPORT and INFO_BLOCK_SIZE always; name and description if asked.
fn info_items(e: &ExportState, structured: bool, asked: &[u16], server: &Server) -> Vec<Info> {
    let cfg = &server.cfg;
    let mut items = vec![
        Info::Export { size_bytes: e.size_bytes, flags: e.tx_flags(structured) },
        Info::BlockSize {
            bytes_min: cfg.block_bytes_min,
            preferred_bytes: cfg.preferred_block_bytes,
            bytes_max: cfg.request_bytes_max,
        },
    ];
    if asked.contains(&info::NAME) {
        items.push(Info::Name(e.name.as_bytes().to_vec()));
    }
    if asked.contains(&info::DESCRIPTION) {
        items.push(Info::Description(e.description.as_bytes().to_vec()));
    }
    items
}

/// Read and drop `n` bytes without holding more than a small chunk.
fn skip(io: &mut impl Read, n: u64) -> io::Result<()> {
    let mut chunk = [0u8; SKIP_CHUNK_BYTES];
    let mut left = n;
    while left > 0 {
        let take = left.min(SKIP_CHUNK_BYTES as u64) as usize;
        io.read_exact(&mut chunk[..take])?;
        left -= take as u64;
    }
    Ok(())
}
