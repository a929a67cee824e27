//! Random bytes fed to every decoder: an error is fine, a panic is not.

use super::*;
use proptest::prelude::*;

fn decode_everything(b: &[u8]) {
    let _ = Greeting::decode(b);
    let _ = ClientFlags::decode(b, client_flags::KNOWN);
    let _ = decode_export_name_reply(b);
    let _ = OptHeader::decode(b);
    let _ = OptReplyHeader::decode(b);
    let _ = InfoRequest::decode(b);
    let _ = Info::decode(b);
    let _ = decode_rep_server(b);
    let _ = Request::decode(b);
    let _ = SimpleReply::decode(b);
    let _ = ChunkHeader::decode(b);
    let _ = decode_error_chunk(b);
    let _ = decode_offset_data(b);
    let _ = MetaContextRequest::decode(b);
    let _ = decode_rep_meta_context(b);
    let _ = decode_block_status(b);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        decode_everything(&b);
    }

    /// Valid magics make the decoders go further before they can fail.
    #[test]
    fn random_bytes_after_a_valid_magic_never_panic(
        which in 0usize..5,
        tail in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut b = match which {
            0 => NBDMAGIC.to_be_bytes().to_vec(),
            1 => IHAVEOPT.to_be_bytes().to_vec(),
            2 => OPT_REPLY_MAGIC.to_be_bytes().to_vec(),
            3 => REQUEST_MAGIC.to_be_bytes().to_vec(),
            _ => STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec(),
        };
        b.extend_from_slice(&tail);
        decode_everything(&b);
    }
}
