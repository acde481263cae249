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
