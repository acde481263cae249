//! Data path over real sockets: writes and reads with immediate data, R2T, unsolicited
//! Data-Out, multi-PDU Data-In, CRC32C digests, residuals, the CmdSN window and MC/S ordering.

mod support;

use iscsi_proto::pdu::*;
use support::*;

#[test]
fn write_then_read_with_immediate_data() {
    let server = TestServer::simple("");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    assert!(c.immediate_data, "ImmediateData=Yes negotiated");
    let data = pattern(1, 8 * 512);
    let w = c.write10(10, &data);
    assert_eq!(w.r2ts, 0, "all data went as immediate data");
    assert_eq!(c.read10(10, 8), data);
}
