//! smbclient (Samba's command-line client) against the server: put, get, ls, rename, mkdir,
//! delete, with checksums of every file; a wrong password; `..` refused.

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

#[test]
fn put_get_ls_rename_delete_with_checksums() {
    let t = start();
    let local = t.dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    // Sizes around the 64 KiB credit unit and the client's I/O size, and an empty file.
    let sizes = [
        0usize,
        1,
        4096,
        65_535,
        65_536,
        65_537,
        1 << 20,
        3 * (1 << 20) + 17,
    ];
    let mut puts = String::new();
    for (i, n) in sizes.iter().enumerate() {
        std::fs::write(local.join(format!("f{i}.bin")), pattern(*n, i as u64 + 1)).unwrap();
        puts.push_str(&format!("put f{i}.bin f{i}.bin; "));
    }
    let o = smbclient(
        t.addr,
        "share",
        USER,
        PASS,
        &local,
        &format!("{puts} mkdir sub; ls"),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    for (i, n) in sizes.iter().enumerate() {
        let name = format!("f{i}.bin");
        assert_eq!(
            sha256(&t.share.join(&name)),
            sha256(&local.join(&name)),
            "{name} on the server"
        );
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(&name))
            .unwrap_or_else(|| panic!("{name} not listed: {out}"));
        assert!(
            line.split_whitespace().any(|w| w == n.to_string()),
            "size of {name}: {line}"
        );
    }
    assert!(t.share.join("sub").is_dir());

    let back = t.dir.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let mut gets = String::new();
    for i in 0..sizes.len() {
        gets.push_str(&format!("get f{i}.bin g{i}.bin; "));
    }
    let o = smbclient(
        t.addr,
        "share",
        USER,
        PASS,
        &back,
        &format!("{gets} rename f1.bin sub\\moved.bin; del f0.bin; rmdir nothing"),
    );
    for i in 0..sizes.len() {
        assert_eq!(
            sha256(&back.join(format!("g{i}.bin"))),
            sha256(&local.join(format!("f{i}.bin"))),
            "g{i}.bin read back\n{}",
            text(&o)
        );
    }
    assert!(t.share.join("sub/moved.bin").is_file(), "{}", text(&o));
    assert!(!t.share.join("f1.bin").exists());
    assert!(!t.share.join("f0.bin").exists(), "{}", text(&o));

    let o = smbclient(
        t.addr,
        "share",
        USER,
        PASS,
        &back,
        "cd sub; get moved.bin m.bin; ls; cd ..; rm f2.bin; ls",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(sha256(&back.join("m.bin")), sha256(&local.join("f1.bin")));
    assert!(!t.share.join("f2.bin").exists());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("moved.bin"), "{}", text(&o));
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

#[test]
fn wrong_password_is_refused() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let t = start();
    let o = smbclient(
        t.addr,
        "share",
        USER,
        "not the password",
        t.dir.path(),
        "ls",
    );
    assert!(!o.status.success(), "{}", text(&o));
    let all = text(&o);
    assert!(all.contains("NT_STATUS_LOGON_FAILURE"), "{all}");
    // The server is still there for the right password.
    let o = smbclient(t.addr, "share", USER, PASS, t.dir.path(), "ls");
    assert!(o.status.success(), "{}", text(&o));
    let o = smbclient(t.addr, "share", "nobody", PASS, t.dir.path(), "ls");
    assert!(text(&o).contains("NT_STATUS_LOGON_FAILURE"), "{}", text(&o));
    let lines = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let failures: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains("SMB logon failure"))
        .collect();
    assert_eq!(failures.len(), 2, "{lines}");
    assert!(
        failures[0].contains("NTLMv2 response does not verify")
            && failures[0].contains("user=alice"),
        "{lines}"
    );
    assert!(
        failures[1].contains("unknown user") && failures[1].contains("user=nobody"),
        "{lines}"
    );
}

#[test]
fn unknown_share_and_traversal() {
    let t = start();
    std::fs::write(t.dir.path().join("secret.txt"), b"outside").unwrap();
    let o = smbclient(t.addr, "nosuch", USER, PASS, t.dir.path(), "ls");
    assert!(
        text(&o).contains("NT_STATUS_BAD_NETWORK_NAME"),
        "{}",
        text(&o)
    );
    let back = t.dir.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let o = smbclient(
        t.addr,
        "share",
        USER,
        PASS,
        &back,
        "get ..\\secret.txt s.txt",
    );
    assert!(!back.join("s.txt").exists(), "{}", text(&o));
    assert!(text(&o).contains("NT_STATUS_"), "{}", text(&o));
}

#[test]
fn encrypted_and_signed_sessions() {
    let t = start();
    let local = t.dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    std::fs::write(local.join("x.bin"), pattern(700_001, 77)).unwrap();
    for (i, protection) in ["encrypt", "sign"].iter().enumerate() {
        let o = std::process::Command::new("smbclient")
            .arg(format!("//{}/share", t.addr.ip()))
            .args(["-p", &t.addr.port().to_string()])
            .args(["-U", &format!("{USER}%{PASS}"), "-m", "SMB3"])
            .arg(format!("--client-protection={protection}"))
            .args(["-c", &format!("put x.bin x{i}.bin; get x{i}.bin y{i}.bin")])
            .current_dir(&local)
            .output()
            .unwrap();
        assert!(o.status.success(), "{protection}: {}", text(&o));
        assert_eq!(
            sha256(&t.share.join(format!("x{i}.bin"))),
            sha256(&local.join("x.bin"))
        );
        assert_eq!(
            sha256(&local.join(format!("y{i}.bin"))),
            sha256(&local.join("x.bin"))
        );
    }
}

/// Polls `cond` until it holds or `secs` pass (the state of another process has no event to
/// wait on).
fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    cond()
}

#[test]
fn change_notify_completes_on_a_change_from_another_connection() {
    let t = start();
    std::fs::create_dir(t.share.join("watched")).unwrap();
    let server = t.server.as_ref().unwrap().server.clone();
    let mut watcher = std::process::Command::new("smbclient")
        .arg(format!("//{}/share", t.addr.ip()))
        .args(["-p", &t.addr.port().to_string()])
        .args(["-U", &format!("{USER}%{PASS}"), "-m", "SMB3"])
        .args(["-c", "notify watched"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(10, || server.watches.lock().len() == 1),
        "no CHANGE_NOTIFY registered"
    );
    assert_eq!(
        server.notified.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    let local = t.dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    std::fs::write(local.join("n.txt"), b"new").unwrap();
    let o = smbclient(
        t.addr,
        "share",
        USER,
        PASS,
        &local,
        "put n.txt watched\\n.txt",
    );
    assert!(o.status.success(), "{}", text(&o));
    // The put answered the watch (smbclient then asks again, so one is registered anew).
    assert!(
        eventually(10, || server
            .notified
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1),
        "the watch was not answered"
    );
    let _ = watcher.kill();
    let out = watcher.wait_with_output().unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains("NT_STATUS_ACCESS_DENIED"), "{all}");
}
