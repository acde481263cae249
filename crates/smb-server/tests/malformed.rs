//! Hostile bytes on the wire: garbage, a compound pointing outside its frame, a MessageId
//! outside the credit window, an oversized frame, a request before NEGOTIATE. Each gets the
//! spec's answer or a disconnect; the server keeps serving new connections.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use smb_proto::msg::negotiate::NegotiateContext;
use smb_proto::msg::{encode_message, EchoRequest, NegotiateRequest};
use smb_proto::{Command, Header, NtStatus};

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn send(s: &mut TcpStream, msg: &[u8]) {
    let mut f = (msg.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(msg);
    s.write_all(&f).unwrap();
}

/// The next frame, or None when the server closed the connection.
fn recv(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut p = [0u8; 4];
    s.read_exact(&mut p).ok()?;
    let len = u32::from_be_bytes(p) as usize & 0x00FF_FFFF;
    let mut b = vec![0u8; len];
    s.read_exact(&mut b).ok()?;
    Some(b)
}

fn header(command: Command, message_id: u64) -> Header {
    let mut blank = vec![0xFE, b'S', b'M', b'B', 64, 0];
    blank.resize(64, 0);
    let mut h = Header::decode(&blank).unwrap();
    h.command = command;
    h.message_id = message_id;
    h.credits = 10;
    h
}

fn negotiate(s: &mut TcpStream) -> Header {
    let salt = [7u8; 32];
    let req = NegotiateRequest {
        security_mode: 1,
        capabilities: 0x4F,
        client_guid: [3; 16],
        dialects: vec![0x0311],
        contexts: vec![NegotiateContext::PreauthIntegrity {
            hash_algorithms: vec![1],
            salt: &salt,
        }],
    };
    send(s, &encode_message(&header(Command::Negotiate, 0), &req));
    let resp = recv(s).expect("NEGOTIATE answered");
    let h = Header::decode(&resp).unwrap();
    assert_eq!(h.nt_status(), NtStatus::SUCCESS);
    h
}

/// A fresh connection still negotiates and answers ECHO.
fn still_serving(addr: SocketAddr) {
    let mut s = connect(addr);
    let h = negotiate(&mut s);
    assert!(h.credits >= 1);
    send(
        &mut s,
        &encode_message(&header(Command::Echo, 1), &EchoRequest),
    );
    let r = recv(&mut s).expect("ECHO answered");
    assert_eq!(Header::decode(&r).unwrap().nt_status(), NtStatus::SUCCESS);
}

fn closed(s: &mut TcpStream) -> bool {
    recv(s).is_none()
}

#[test]
fn garbage_closes_the_connection() {
    let t = common::start();
    let mut s = connect(t.addr);
    s.write_all(&common::pattern(1000, 9)).unwrap();
    assert!(closed(&mut s));
    let mut s = connect(t.addr);
    // A well-framed message that is not SMB.
    send(
        &mut s,
        b"GET / HTTP/1.0\r\n\r\n........................................................",
    );
    assert!(closed(&mut s));
    still_serving(t.addr);
}

#[test]
fn oversized_frame_and_request_before_negotiate() {
    let t = common::start();
    let mut s = connect(t.addr);
    s.write_all(&[0, 0xFF, 0xFF, 0xFF]).unwrap();
    assert!(closed(&mut s));
    let mut s = connect(t.addr);
    send(
        &mut s,
        &encode_message(&header(Command::Echo, 0), &EchoRequest),
    );
    assert!(closed(&mut s));
    still_serving(t.addr);
}

#[test]
fn compound_pointing_outside_the_frame() {
    let t = common::start();
    let mut s = connect(t.addr);
    negotiate(&mut s);
    // Two ECHOs; the first's NextCommand points past the end of the frame.
    let mut h = header(Command::Echo, 1);
    h.next_command = 4096;
    let mut msg = encode_message(&h, &EchoRequest);
    msg.resize(72, 0);
    msg.extend_from_slice(&encode_message(&header(Command::Echo, 2), &EchoRequest));
    send(&mut s, &msg);
    // Either the chain is refused as a whole (disconnect) or its first element is answered.
    if let Some(r) = recv(&mut s) {
        let rh = Header::decode(&r).unwrap();
        assert_eq!(rh.message_id, 1);
        assert_eq!(
            rh.next_command, 0,
            "nothing after the malformed element is answered"
        );
    }
    // NextCommand not 8-aligned and shorter than a header: the same.
    let mut s2 = connect(t.addr);
    negotiate(&mut s2);
    let mut h = header(Command::Echo, 1);
    h.next_command = 13;
    let mut msg = encode_message(&h, &EchoRequest);
    msg.extend_from_slice(&[0u8; 80]);
    send(&mut s2, &msg);
    if let Some(r) = recv(&mut s2) {
        assert_eq!(Header::decode(&r).unwrap().message_id, 1);
    }
    still_serving(t.addr);
}

#[test]
fn credit_abuse_disconnects() {
    let t = common::start();
    // A MessageId far outside the granted window.
    let mut s = connect(t.addr);
    negotiate(&mut s);
    send(
        &mut s,
        &encode_message(&header(Command::Echo, 1_000_000), &EchoRequest),
    );
    assert!(closed(&mut s));
    // A MessageId used twice.
    let mut s = connect(t.addr);
    negotiate(&mut s);
    send(
        &mut s,
        &encode_message(&header(Command::Echo, 1), &EchoRequest),
    );
    assert!(recv(&mut s).is_some());
    send(
        &mut s,
        &encode_message(&header(Command::Echo, 1), &EchoRequest),
    );
    assert!(closed(&mut s));
    // A CreditCharge that does not cover the payload: STATUS_INVALID_PARAMETER, no disconnect.
    let mut s = connect(t.addr);
    negotiate(&mut s);
    let mut h = header(Command::Read, 1);
    h.credit_charge = 1;
    h.credits = 1;
    let read = smb_proto::msg::ReadRequest {
        padding: 0x50,
        flags: 0,
        length: 1 << 20,
        offset: 0,
        file_id: smb_proto::msg::FileId::default(),
        minimum_count: 0,
        channel: 0,
        remaining_bytes: 0,
        read_channel_info: &[],
    };
    send(&mut s, &encode_message(&h, &read));
    let r = recv(&mut s).expect("answered");
    assert_eq!(
        Header::decode(&r).unwrap().nt_status(),
        NtStatus::INVALID_PARAMETER
    );
    still_serving(t.addr);
}

#[test]
fn a_lone_cancel_gets_no_answer_and_the_connection_stays() {
    let t = common::start();
    let mut s = connect(t.addr);
    negotiate(&mut s);
    send(
        &mut s,
        &encode_message(&header(Command::Cancel, 5), &smb_proto::msg::CancelRequest),
    );
    send(
        &mut s,
        &encode_message(&header(Command::Echo, 1), &EchoRequest),
    );
    let r = recv(&mut s).expect("ECHO answered after the CANCEL");
    let h = Header::decode(&r).unwrap();
    assert_eq!((h.command, h.message_id), (Command::Echo, 1));
}

#[test]
fn random_frames_after_negotiate_never_kill_the_server() {
    let t = common::start();
    for seed in 1..40u64 {
        if seed % 20 == 12 {
            // CANCEL has no answer of its own.
            continue;
        }
        let mut s = connect(t.addr);
        negotiate(&mut s);
        // A valid header with a random command and random body bytes.
        let mut h = header(Command::from_u16((seed % 20) as u16), 1);
        h.session_id = seed;
        let mut msg = Vec::new();
        h.encode(&mut msg);
        msg.extend_from_slice(&common::pattern((seed as usize * 37) % 300, seed));
        send(&mut s, &msg);
        let _ = recv(&mut s);
    }
    still_serving(t.addr);
}

#[test]
fn an_unknown_command_related_to_a_failed_request_is_invalid_parameter() {
    let t = common::start();
    let mut s = connect(t.addr);
    negotiate(&mut s);
    // A TREE_CONNECT without a session (it fails), then a related request with no such
    // command: the second answers INVALID_PARAMETER of its own instead of the first one's
    // status (smbtorture smb2.compound.invalid4).
    let path = smb_proto::utf16le("\\\\host\\share");
    let tc = smb_proto::msg::TreeConnectRequest {
        flags: 0,
        path: &path,
    };
    let mut msg = encode_message(&header(Command::TreeConnect, 1), &tc);
    let first_len = msg.len().div_ceil(8) * 8;
    msg.resize(first_len, 0);
    msg[20..24].copy_from_slice(&(first_len as u32).to_le_bytes()); // NextCommand
    let mut second = header(Command::Other(0xFF), 2);
    second.flags.0 |= smb_proto::Flags::RELATED_OPERATIONS;
    msg.extend_from_slice(&encode_message(&second, &EchoRequest));
    send(&mut s, &msg);
    let r = recv(&mut s).expect("the chain is answered");
    let h1 = Header::decode(&r).unwrap();
    assert!(h1.nt_status().is_error(), "{:?}", h1.nt_status());
    assert_ne!(h1.nt_status(), NtStatus::INVALID_PARAMETER);
    let rest = if h1.next_command > 0 {
        r[h1.next_command as usize..].to_vec()
    } else {
        recv(&mut s).expect("the second element is answered")
    };
    let h2 = Header::decode(&rest).unwrap();
    assert_eq!(h2.message_id, 2);
    assert_eq!(h2.nt_status(), NtStatus::INVALID_PARAMETER);
    still_serving(t.addr);
}
