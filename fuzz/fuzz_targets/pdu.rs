//! Fuzz target: `Framer::decode` over arbitrary bytes with every framing combination (header
//! digest, data digest, small and large segment limits), re-encoding whatever decodes.
#![no_main]

use bytes::BytesMut;
use iscsi_proto::Framer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let framer = Framer {
        header_digest: mode & 1 != 0,
        data_digest: mode & 2 != 0,
        max_recv_data_segment_length: if mode & 4 != 0 { 512 } else { 1 << 24 },
    };
    let mut buf = BytesMut::from(rest);
    while let Ok(Some(pdu)) = framer.decode(&mut buf) {
        // Whatever decodes must encode and decode to itself; unknown opcodes keep their raw
        // header, whose AHS length the encoder rewrites, so they are left out.
        if matches!(pdu, iscsi_proto::Pdu::Unknown { .. }) {
            continue;
        }
        let wire = framer.encode_to_vec(&pdu);
        let mut again = BytesMut::from(&wire[..]);
        let big = Framer {
            max_recv_data_segment_length: 1 << 24,
            ..framer
        };
        assert_eq!(big.decode(&mut again), Ok(Some(pdu)));
    }
});
