//! WRITE request and response as Windows sent them inside the encrypted examples of Microsoft's
//! Open Specifications blog posts ("SMB 3.1.1 Encryption in Windows 10", "Encryption in SMB 3.0:
//! A protocol perspective"): the plaintexts those posts print.

mod common;

use common::hex;
use smb_proto::msg::{Message, Request, WriteRequest, WriteResponse};
use smb_proto::{split_compound, Command, Flags, HeaderIds, HEADER_LEN};

const WRITE_311: &str = "
    FE534D4240000100000000000900010008000000000000000500000000000000FFFE000001000000
    25000000001000000000000000000000000000000000000031007000170000000000000000000000
    0600000004000000010000000400000000000000000000007000000000000000536D623320656E63
    72797074696F6E2074657374696E67";
const WRITE_311_RESPONSE: &str = "
    FE534D4240000100000000000900010001000000000000000500000000000000FFFE000001000000
    25000000001000000000000000000000000000000000000011000000170000000000000000000000";
const WRITE_30: &str = "
    FE534D4240000100000000000900400008000000000000000400000000000000
    FFFE0000010000001100001400E4080000000000000000000000000000000000
    3100700017000000000000000000000015010000390000020100000039020000
    00000000000000007000000000000000536D623320656E6372797074696F6E20
    74657374696E67";

#[test]
fn write_requests_decode() {
    for (msg, session, fid) in [
        (
            WRITE_311,
            0x1000_0000_0025u64,
            (0x4_0000_0006u64, 0x4_0000_0001u64),
        ),
        (
            WRITE_30,
            0x0008_E400_1400_0011,
            (0x0200_0039_0000_0115, 0x0000_0239_0000_0001),
        ),
    ] {
        let m = hex(msg);
        let els = split_compound(&m).unwrap();
        assert_eq!(els.len(), 1);
        let h = &els[0].header;
        assert_eq!(h.command, Command::Write);
        assert!(h.flags.is_signed());
        assert!(!h.flags.has(Flags::SERVER_TO_REDIR));
        assert_eq!(h.session_id, session);
        assert_eq!(
            h.ids,
            HeaderIds::Sync {
                process_id: 0xFEFF,
                tree_id: 1
            }
        );
        let Request::Write(w) = Request::decode(h, &m).unwrap() else {
            panic!()
        };
        assert_eq!(w.data, b"Smb3 encryption testing");
        assert_eq!(w.offset, 0);
        assert_eq!((w.file_id.persistent, w.file_id.volatile), fid);
        assert_eq!(Request::Write(w.clone()).payload_size(), 23);
        // The payload is a view into the message, not a copy.
        let start = m.as_ptr() as usize;
        assert_eq!(w.data.as_ptr() as usize - start, 0x70);
    }
}

#[test]
fn write_response_decodes_and_re_encodes() {
    let m = hex(WRITE_311_RESPONSE);
    let r = WriteResponse::decode(&m).unwrap();
    assert_eq!(
        r,
        WriteResponse {
            count: 23,
            remaining: 0
        }
    );
    let mut again = m[..HEADER_LEN].to_vec();
    r.encode(&mut again);
    assert_eq!(again, m);
    assert!(WriteRequest::decode(&m).is_err());
}
