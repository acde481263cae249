//! Fuzz target: direct-TCP framing, the SMB2 header, compound chain splitting and every request
//! decoder on each element; whatever decodes re-encodes to a header that decodes to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smb_proto::msg::Request;
use smb_proto::{split_compound, DirectTcp, Header};

fuzz_target!(|data: &[u8]| {
    let framer = DirectTcp { max_frame: 1 << 20 };
    let mut rest = data;
    while let Ok(Some((used, frame))) = framer.decode(rest) {
        check(frame);
        rest = rest.get(used..).unwrap_or(&[]);
    }
    check(data);
});

fn check(frame: &[u8]) {
    let Ok(elements) = split_compound(frame) else {
        return;
    };
    for e in elements {
        assert!(e.bytes.len() >= smb_proto::HEADER_LEN);
        let again = e.header.to_bytes();
        assert_eq!(Header::decode(&again).as_ref(), Ok(&e.header));
        if let Ok(req) = Request::decode(&e.header, e.bytes) {
            let _ = req.payload_size();
        }
    }
}
