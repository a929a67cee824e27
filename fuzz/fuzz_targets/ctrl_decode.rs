//! The control-datagram decoder: any bytes give an envelope or an error,
//! never a panic. The input is also signed with a valid MAC on a copy, or
//! the fuzzer would never get past the MAC to the body parser; whatever
//! decodes re-encodes to exactly the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memlend_wire::ctrl::{decode, encode, CtrlKey, CTRL_MAC_BYTES, DATAGRAM_BYTES_MAX};

fuzz_target!(|data: &[u8]| {
    let key = CtrlKey::new(&[7; 32]);
    let _ = decode(data, &key);
    let mut signed = data.to_vec();
    signed.extend_from_slice(&[0; CTRL_MAC_BYTES]);
    let n = signed.len() - CTRL_MAC_BYTES;
    let mac = key.mac(&signed[..n]);
    signed[n..].copy_from_slice(&mac);
    if let Ok(env) = decode(&signed, &key) {
        let mut out = [0u8; DATAGRAM_BYTES_MAX];
        let len = encode(&env, &key, &mut out).expect("what decodes encodes");
        assert_eq!(&out[..len], &signed[..], "re-encoding differs");
    }
});
