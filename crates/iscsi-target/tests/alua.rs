//! Implicit ALUA through the status socket: a portal group moved to standby raises
//! ASYMMETRIC ACCESS STATE CHANGED on the sessions and then answers media access with the
//! standby sense, and moving it back restores access.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use support::*;

fn admin(server: &TestServer, request: &str) -> serde_json::Value {
    let mut s = UnixStream::connect(server.status_socket()).expect("status socket");
    s.write_all(request.as_bytes()).unwrap();
    s.write_all(b"\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).expect("JSON reply")
}

#[test]
fn portal_group_state_change_reaches_every_session() {
    let server = TestServer::simple("");
    let mut a = Conn::login_to(server.addr(), &LoginOpts::normal());
    let reply = admin(&server, r#"{"cmd":"alua","group":1,"state":"standby"}"#);
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(a.tur(), (2, Some((0x06, 0x2a, 0x06))), "UA on the session");
    let r = a.scsi(&cdb_read10(0, 1), 512, None).unwrap();
    assert_eq!(
        (r.status, r.sense_triplet()),
        (2, Some((0x02, 0x04, 0x0b))),
        "standby refuses media access"
    );
    let reply = admin(
        &server,
        r#"{"cmd":"alua","group":1,"state":"active-optimized"}"#,
    );
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(a.tur(), (2, Some((0x06, 0x2a, 0x06))));
    assert_eq!(a.read10(0, 1).len(), 512);
    let bad = admin(&server, r#"{"cmd":"alua","group":9,"state":"standby"}"#);
    assert!(bad["error"].is_string(), "{bad}");
}
