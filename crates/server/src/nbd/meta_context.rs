//! Metadata contexts: this server knows one, `base:allocation`, and answers
//! `OPT_LIST_META_CONTEXT` and `OPT_SET_META_CONTEXT` for it.

use super::export::ExportState;
use super::server::Server;
use memlend_wire::nbd::{encode_opt_reply, encode_rep_meta_context, opt, rep};
use memlend_wire::nbd::{MetaContextRequest, BASE_ALLOCATION};
use std::sync::Arc;

/// The id `base:allocation` gets when selected; block status chunks carry it.
pub(crate) const BASE_ALLOCATION_ID: u32 = 1;
/// The id in `OPT_LIST_META_CONTEXT` replies, which the protocol reserves.
const LISTED_ID: u32 = 0;

/// Whether `query` asks for `base:allocation`: by its name, or when
/// listing by its namespace alone (`base:`). Any other query matches
/// nothing; that is not an error.
fn matches(query: &[u8], listing: bool) -> bool {
    query == BASE_ALLOCATION.as_bytes() || (listing && query == b"base:")
}

/// Answer LIST or SET_META_CONTEXT into `out`. `selected` is the export for
/// which `base:allocation` is selected: a SET replaces it (clears it first,
/// so even a refused SET leaves nothing selected).
pub(crate) fn answer(
    out: &mut Vec<u8>,
    server: &Server,
    structured: bool,
    selected: &mut Option<Arc<ExportState>>,
    option: u32,
    data: &[u8],
) {
    let set = option == opt::SET_META_CONTEXT;
    if set {
        *selected = None;
    }
    let req = match MetaContextRequest::decode(data) {
        Ok(r) => r,
        Err(e) => return encode_opt_reply(out, option, rep::ERR_INVALID, e.to_string().as_bytes()),
    };
    if set && !structured {
        let why = b"block status needs structured replies: send NBD_OPT_STRUCTURED_REPLY first";
        return encode_opt_reply(out, option, rep::ERR_INVALID, why);
    }
    let Some(export) = server.find(req.name) else {
        return encode_opt_reply(out, option, rep::ERR_UNKNOWN, b"no such export");
    };
    // LIST without queries lists every context; SET without selects none.
    let listing = !set;
    let wanted =
        (listing && req.queries.is_empty()) || req.queries.iter().any(|q| matches(q, listing));
    if wanted {
        let id = if set { BASE_ALLOCATION_ID } else { LISTED_ID };
        let payload = encode_rep_meta_context(id, BASE_ALLOCATION.as_bytes());
        encode_opt_reply(out, option, rep::META_CONTEXT, &payload);
        if set {
            *selected = Some(Arc::clone(export));
        }
    }
    encode_opt_reply(out, option, rep::ACK, &[]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_base_allocation_and_its_namespace_match() {
        assert!(matches(b"base:allocation", false));
        assert!(matches(b"base:allocation", true));
        assert!(matches(b"base:", true));
        assert!(!matches(b"base:", false), "a namespace alone selects nothing");
        for other in [&b"base:allocation2"[..], b"qemu:dirty-bitmap:x", b"", b"base"] {
            assert!(!matches(other, true), "{other:?}");
        }
    }
}
