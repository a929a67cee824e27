//! The four handshake frames and the key-file parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memlend_wire::page::{Auth, Challenge, Hello, Key, Welcome};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }
    if let Ok(c) = Challenge::decode(data) {
        assert_eq!(Challenge::decode(&c.encode()), Ok(c));
    }
    if let Ok(a) = Auth::decode(data) {
        assert_eq!(Auth::decode(&a.encode()), Ok(a));
    }
    let _ = Welcome::decode(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Key::from_hex(text);
    }
});
