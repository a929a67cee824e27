//! The page server's request decoder: any bytes give a header or an error,
//! never a panic; whatever decodes re-encodes to the same bytes. The header
//! CRC is fixed up on a copy too, or the fuzzer would never get past it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memlend_wire::page::{limits, ReqHeader, REQ_HEADER_LEN};

fn check(data: &[u8]) {
    if let Ok(h) = ReqHeader::decode(data) {
        assert_eq!(&h.encode()[..], &data[..REQ_HEADER_LEN]);
        assert!(h.payload_len <= limits::PAYLOAD_BYTES_MAX);
        if let Ok(op) = h.validate(limits::BATCH_PAGES_MAX) {
            let expected = ReqHeader::expected_payload(op, h.count, h.sealed());
            assert_eq!(expected, h.payload_len as u64);
            assert!(h.count <= limits::BATCH_PAGES_MAX || expected == 0);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= REQ_HEADER_LEN {
        let mut fixed = data[..REQ_HEADER_LEN].to_vec();
        let crc = crc32c::crc32c(&fixed[..44]);
        fixed[44..48].copy_from_slice(&crc.to_le_bytes());
        check(&fixed);
    }
});
