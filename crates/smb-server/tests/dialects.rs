//! smbclient over each dialect below 3.1.1: SMB 2.0.2, 2.1, 3.0 and 3.0.2, signed (HMAC-SHA256
//! for 2.x, AES-128-CMAC for 3.0.x, with keys from their own key schedules) and, for 3.0 and
//! 3.0.2, encrypted (AES-128-CCM): put and get with checksums, the dialect the server logged
//! for the session; `min-dialect` refusing older clients.

mod common;

use common::*;

fn text(o: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Log lines captured for the assertions (each test runs in its own process under nextest).
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn install() -> Captured {
        let log = Captured::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || writer.clone())
            .init();
        log
    }
    /// Takes the lines logged so far.
    fn take(&self) -> String {
        String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
    }
}

/// smbclient limited to `protocol` (its -m names) with `protection` (sign or encrypt).
fn smbclient_at(
    t: &TestServer,
    protocol: &str,
    protection: &str,
    cwd: &std::path::Path,
    commands: &str,
) -> std::process::Output {
    std::process::Command::new("smbclient")
        .arg(format!("//{}/share", t.addr.ip()))
        .args(["-p", &t.addr.port().to_string()])
        .args(["-U", &format!("{USER}%{PASS}")])
        .args(["-m", protocol])
        .arg("--option=client min protocol=SMB2_02")
        .arg(format!("--client-protection={protection}"))
        .args(["-c", commands])
        .current_dir(cwd)
        .output()
        .expect("smbclient runs (package smbclient)")
}

#[test]
fn each_dialect_signed_and_encrypted_with_checksums() {
    let log = Captured::install();
    let t = start();
    let local = t.dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    // Above 64 KiB (2.0.2 splits it into 64 KiB requests; the others use multi-credit ones).
    std::fs::write(local.join("x.bin"), pattern(1_000_003, 9)).unwrap();
    let want = sha256(&local.join("x.bin"));
    let cases = [
        ("SMB2_02", "2.0.2", "HMAC-SHA256", "sign"),
        ("SMB2_10", "2.1", "HMAC-SHA256", "sign"),
        ("SMB3_00", "3.0", "AES-128-CMAC", "sign"),
        ("SMB3_00", "3.0", "AES-128-CMAC", "encrypt"),
        ("SMB3_02", "3.0.2", "AES-128-CMAC", "sign"),
        ("SMB3_02", "3.0.2", "AES-128-CMAC", "encrypt"),
    ];
    for (i, (protocol, dialect, signing, protection)) in cases.into_iter().enumerate() {
        let what = format!("{protocol} {protection}");
        let o = smbclient_at(
            &t,
            protocol,
            protection,
            &local,
            &format!("put x.bin x{i}.bin; get x{i}.bin y{i}.bin"),
        );
        assert!(o.status.success(), "{what}: {}", text(&o));
        assert_eq!(sha256(&t.share.join(format!("x{i}.bin"))), want, "{what}");
        assert_eq!(sha256(&local.join(format!("y{i}.bin"))), want, "{what}");
        let lines = log.take();
        let session = lines
            .lines()
            .find(|l| l.contains("SMB session") && l.contains("established"))
            .unwrap_or_else(|| panic!("{what}: no session logged\n{lines}"));
        assert!(
            session.contains(&format!("dialect=\"{dialect}\""))
                || session.contains(&format!("dialect={dialect} ")),
            "{what}: {session}"
        );
        assert!(session.contains(signing), "{what}: {session}");
        let encrypted = lines
            .lines()
            .find(|l| l.contains("SMB connection encrypted"));
        if protection == "encrypt" {
            let l = encrypted.unwrap_or_else(|| panic!("{what}: no transform seen\n{lines}"));
            assert!(l.contains("AES-128-CCM"), "{what}: {l}");
            assert!(session.contains("AES-128-CCM"), "{what}: {session}");
        } else {
            assert!(encrypted.is_none(), "{what}: {lines}");
        }
    }
}

#[test]
fn min_dialect_refuses_older_clients() {
    let t = start_with(|c| c.min_dialect = 0x0300);
    let local = t.dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    std::fs::write(local.join("a.txt"), b"abc").unwrap();
    for protocol in ["SMB2_02", "SMB2_10"] {
        let o = smbclient_at(&t, protocol, "sign", &local, "put a.txt a.txt");
        assert!(!o.status.success(), "{protocol}: {}", text(&o));
        assert!(!t.share.join("a.txt").exists(), "{protocol}");
    }
    let o = smbclient_at(&t, "SMB3_00", "sign", &local, "put a.txt a.txt");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read(t.share.join("a.txt")).unwrap(), b"abc");
}

mod raw {
    use std::io::{Read as _, Write as _};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    use smb_proto::msg::NegotiateResponse;
    use smb_proto::msg::{encode_message, EchoRequest, Message as _, NegotiateRequest};
    use smb_proto::{Command, Header, HEADER_LEN};

    pub fn connect(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    pub fn send(s: &mut TcpStream, msg: &[u8]) {
        let mut f = (msg.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(msg);
        s.write_all(&f).unwrap();
    }

    /// The next frame, or None when the server closed the connection.
    pub fn recv(s: &mut TcpStream) -> Option<Vec<u8>> {
        let mut p = [0u8; 4];
        s.read_exact(&mut p).ok()?;
        let len = u32::from_be_bytes(p) as usize & 0x00FF_FFFF;
        let mut b = vec![0u8; len];
        s.read_exact(&mut b).ok()?;
        Some(b)
    }

    /// An SMB1 multi-protocol NEGOTIATE offering `dialects`.
    pub fn smb1_negotiate(dialects: &[&str]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for d in dialects {
            bytes.push(2);
            bytes.extend_from_slice(d.as_bytes());
            bytes.push(0);
        }
        let mut m = vec![0xFF, b'S', b'M', b'B', 0x72];
        m.extend_from_slice(&[0; 27]);
        m.push(0);
        m.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        m.extend_from_slice(&bytes);
        m
    }

    /// The dialect and capabilities of a NEGOTIATE response frame.
    pub fn answered(frame: &[u8]) -> (u16, u32) {
        let h = Header::decode(frame).unwrap();
        assert_eq!(h.command, Command::Negotiate);
        assert!(frame.len() > HEADER_LEN);
        let r = NegotiateResponse::decode(frame).unwrap();
        assert!(r.contexts.is_empty());
        (r.dialect, r.capabilities)
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

    pub fn smb2_negotiate(s: &mut TcpStream, message_id: u64, dialects: &[u16]) -> Option<Vec<u8>> {
        let req = NegotiateRequest {
            security_mode: 1,
            capabilities: 0x47,
            client_guid: [5; 16],
            dialects: dialects.to_vec(),
            contexts: Vec::new(),
        };
        send(
            s,
            &encode_message(&header(Command::Negotiate, message_id), &req),
        );
        recv(s)
    }

    pub fn echo(s: &mut TcpStream, message_id: u64) -> Option<Vec<u8>> {
        send(
            s,
            &encode_message(&header(Command::Echo, message_id), &EchoRequest),
        );
        recv(s)
    }
}

/// MS-SMB2 3.3.5.3.1: "SMB 2.???" gets 0x02FF and a second, SMB2 NEGOTIATE settles the
/// dialect; "SMB 2.002" alone settles 2.0.2 at once (a NEGOTIATE after it ends the
/// connection); with `min-dialect` above 2.0.2 that connection is refused.
#[test]
fn smb1_negotiate_wildcard_and_202() {
    use raw::*;
    let t = start();
    let mut s = connect(t.addr);
    send(
        &mut s,
        &smb1_negotiate(&["NT LM 0.12", "SMB 2.002", "SMB 2.???"]),
    );
    assert_eq!(answered(&recv(&mut s).unwrap()).0, 0x02FF);
    let resp = smb2_negotiate(&mut s, 1, &[0x0202, 0x0210]).expect("answered");
    assert_eq!(answered(&resp), (0x0210, 0x06));

    let mut s = connect(t.addr);
    send(&mut s, &smb1_negotiate(&["NT LM 0.12", "SMB 2.002"]));
    // 2.0.2: no LARGE_MTU, LEASING or MULTI_CHANNEL.
    assert_eq!(answered(&recv(&mut s).unwrap()), (0x0202, 0));
    // Negotiated: ECHO is served, a NEGOTIATE ends the connection.
    assert!(echo(&mut s, 1).is_some());
    assert!(smb2_negotiate(&mut s, 2, &[0x0202]).is_none());

    let t = start_with(|c| c.min_dialect = 0x0210);
    let mut s = connect(t.addr);
    send(&mut s, &smb1_negotiate(&["NT LM 0.12", "SMB 2.002"]));
    assert!(recv(&mut s).is_none());
    // 3.0 over SMB2 NEGOTIATE: ENCRYPTION offered (the client has it), no contexts.
    let mut s = connect(t.addr);
    let resp = smb2_negotiate(&mut s, 0, &[0x0202, 0x0210, 0x0300]).expect("answered");
    assert_eq!(answered(&resp), (0x0300, 0x4E));
}
