//! The client's reply decoder (with the header CRC fixed up on a copy, so
//! the fuzzer reaches the fields) and the STAT payload decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memlend_wire::page::{limits, RepHeader, StatReply, REP_HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = RepHeader::decode(data) {
        assert!(h.payload_len <= limits::REPLY_PAYLOAD_BYTES_MAX);
    }
    if data.len() >= REP_HEADER_LEN {
        let mut fixed = data[..REP_HEADER_LEN].to_vec();
        let crc = crc32c::crc32c(&fixed[..36]);
        fixed[36..40].copy_from_slice(&crc.to_le_bytes());
        if let Ok(h) = RepHeader::decode(&fixed) {
            assert!(h.payload_len <= limits::REPLY_PAYLOAD_BYTES_MAX);
            assert_eq!(&h.encode()[..4], &fixed[..4]);
        }
    }
    if let Ok(s) = StatReply::decode(data) {
        assert_eq!(StatReply::decode(&s.encode()), Ok(s));
    }
});
