//! Fuzz target: the replication peer-link decoder over arbitrary bytes; whatever decodes must
//! encode back to the same bytes.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = Bytes::copy_from_slice(data);
    while let Ok(Some((msg, used))) = replication::decode(&buf) {
        assert_eq!(replication::encode_to_vec(&msg), buf[..used]);
        buf = buf.slice(used..);
    }
});
