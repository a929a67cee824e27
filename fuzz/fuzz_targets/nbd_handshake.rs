//! The NBD option haggling as the server sees it: the input is everything a
//! client sends after the greeting (client flags, then options), cut up and
//! decoded in the order and with the limits of `negotiate` in
//! `crates/server/src/nbd/handshake.rs`. That function is crate-private (it
//! needs a `Server` with real exports), so this walks the same steps with
//! the same wire decoders: no panic, whatever decodes re-encodes to exactly
//! the bytes it came from, and every reply the server would build from the
//! client's data decodes back to what was put in.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memlend_wire::nbd::{
    client_flags, decode_export_name_reply, encode_export_name_reply, encode_opt_reply, info, opt,
    rep, tx_flags, ClientFlags, Info, InfoRequest, OptHeader, OptReplyHeader, CLIENT_FLAGS_LEN,
    EXPORT_NAME_PADDING_LEN, EXPORT_NAME_REPLY_LEN, OPT_HEADER_LEN, OPT_REPLY_HEADER_LEN,
    STRING_BYTES_MAX,
};

/// `NbdConfig::default()` of the server: option data kept in memory, and
/// options allowed before an export is chosen.
const OPTION_BYTES_MAX: u32 = 64 << 10;
const OPTIONS_MAX: u32 = 256;

/// What the server answers for a read-write export of 1 GiB.
const EXPORT_BYTES: u64 = 1 << 30;
const EXPORT_FLAGS: u16 = tx_flags::HAS_FLAGS
    | tx_flags::SEND_FLUSH
    | tx_flags::SEND_FUA
    | tx_flags::CAN_MULTI_CONN
    | tx_flags::SEND_CACHE
    | tx_flags::SEND_TRIM
    | tx_flags::SEND_WRITE_ZEROES
    | tx_flags::SEND_FAST_ZERO;

fn export_flags(structured: bool) -> u16 {
    if structured {
        EXPORT_FLAGS | tx_flags::SEND_DF
    } else {
        EXPORT_FLAGS
    }
}

/// The next `n` bytes of the stream, or None when the client stopped short
/// (the server's `read_exact` would fail and the connection end).
fn take<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if input.len() < n {
        return None;
    }
    let (head, tail) = input.split_at(n);
    *input = tail;
    Some(head)
}

/// Build an option reply as the server does and check it decodes back.
fn reply(option: u32, reply: u32, payload: &[u8]) {
    let mut out = Vec::new();
    encode_opt_reply(&mut out, option, reply, payload);
    let h = OptReplyHeader::decode(&out).expect("an encoded option reply decodes");
    assert_eq!(h, OptReplyHeader { option, reply, len: payload.len() as u32 });
    assert_eq!(&out[OPT_REPLY_HEADER_LEN..], payload);
}

/// OPT_INFO / OPT_GO: the payload names an export and lists info types.
/// Returns true when the option ends negotiation (a valid OPT_GO).
fn info_or_go(option: u32, data: &[u8], structured: bool) -> bool {
    let req = match InfoRequest::decode(data) {
        Ok(r) => r,
        Err(e) => {
            reply(option, rep::ERR_INVALID, e.to_string().as_bytes());
            return false;
        }
    };
    // The decoder insists on the exact length, so nothing is left over.
    assert_eq!(req.encode(), data, "InfoRequest does not re-encode to its bytes");
    assert!(req.name.len() <= STRING_BYTES_MAX);
    // The items the server sends back for an export of that name.
    let mut items = vec![
        Info::Export { size_bytes: EXPORT_BYTES, flags: export_flags(structured) },
        Info::BlockSize { bytes_min: 1, preferred_bytes: 4096, bytes_max: 32 << 20 },
    ];
    // The name asked for is the export's name when the export exists.
    if req.requests.contains(&info::NAME) {
        items.push(Info::Name(req.name.to_vec()));
    }
    if req.requests.contains(&info::DESCRIPTION) {
        items.push(Info::Description(b"fuzzed export".to_vec()));
    }
    for item in &items {
        let b = item.encode();
        assert_eq!(&Info::decode(&b).expect("an encoded info item decodes"), item);
        reply(option, rep::INFO, &b);
    }
    reply(option, rep::ACK, &[]);
    option == opt::GO
}

fn negotiate(mut input: &[u8]) {
    let Some(raw) = take(&mut input, CLIENT_FLAGS_LEN) else { return };
    let offered = client_flags::C_FIXED_NEWSTYLE | client_flags::C_NO_ZEROES;
    let Ok(flags) = ClientFlags::decode(raw, offered) else { return };
    // Only offered bits pass, and each of them is a field: exact round trip.
    assert_eq!(&flags.encode()[..], raw);
    let mut structured = false;
    for _ in 0..OPTIONS_MAX {
        let Some(raw) = take(&mut input, OPT_HEADER_LEN) else { return };
        let Ok(h) = OptHeader::decode(raw) else { return };
        assert_eq!(&h.encode()[..], raw);
        if !flags.fixed_newstyle && h.option != opt::EXPORT_NAME {
            return;
        }
        if h.len > OPTION_BYTES_MAX {
            if h.option == opt::EXPORT_NAME {
                return;
            }
            if take(&mut input, h.len as usize).is_none() {
                return;
            }
            reply(h.option, rep::ERR_TOO_BIG, b"option data too long");
            continue;
        }
        let Some(data) = take(&mut input, h.len as usize) else { return };
        match h.option {
            opt::EXPORT_NAME => {
                // An unknown name is logged lossily and ends the connection;
                // a known one is answered with size and flags.
                let _ = String::from_utf8_lossy(data);
                let mut out = Vec::new();
                let tx = export_flags(structured);
                encode_export_name_reply(&mut out, EXPORT_BYTES, tx, flags.no_zeroes);
                let padding = if flags.no_zeroes { 0 } else { EXPORT_NAME_PADDING_LEN };
                assert_eq!(out.len(), EXPORT_NAME_REPLY_LEN + padding);
                assert_eq!(decode_export_name_reply(&out), Ok((EXPORT_BYTES, tx)));
                return;
            }
            opt::ABORT => {
                reply(h.option, rep::ACK, &[]);
                return;
            }
            opt::LIST if data.is_empty() => reply(h.option, rep::ACK, &[]),
            opt::STRUCTURED_REPLY if data.is_empty() => {
                structured = true;
                reply(h.option, rep::ACK, &[]);
            }
            opt::LIST | opt::STRUCTURED_REPLY => {
                reply(h.option, rep::ERR_INVALID, b"this option takes no data")
            }
            opt::INFO | opt::GO => {
                if info_or_go(h.option, data, structured) {
                    return;
                }
            }
            _ => reply(h.option, rep::ERR_UNSUP, b"option not supported by memlend"),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    negotiate(data);
    // The option payload decoder on its own, on the whole input.
    if let Ok(req) = InfoRequest::decode(data) {
        assert_eq!(req.encode(), data);
    }
});
