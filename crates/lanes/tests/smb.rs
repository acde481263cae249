//! SMB through the lanes binary: `lanes smb user add`, `lanes serve` with a `[[share]]`, the
//! banner's mount line, smbclient put/get with checksums, and config errors that name the line.

mod served;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

fn lanes() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lanes"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn sha256(p: &Path) -> Vec<u8> {
    use sha2::Digest as _;
    sha2::Sha256::digest(std::fs::read(p).unwrap()).to_vec()
}

/// `lanes smb user add carol` (password "Password") to the users file of `cfg`.
fn add_carol(dir: &Path, cfg: &Path) {
    std::fs::write(dir.join("pw"), "Password\n").unwrap();
    let out = lanes()
        .args(["smb", "user", "add", "carol", "--config"])
        .arg(cfg)
        .arg("--password-file")
        .arg(dir.join("pw"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

fn config(dir: &Path, smb_port: u16, extra: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir.join("share")).unwrap();
    let text = format!(
        "[server]\ndata-dir = \"data\"\n\n[[portal-group]]\ntag = 1\nportals = [\"127.0.0.1:0\"]\n\n\
         [[target]]\nname = \"iqn.2026-11.io.lanes.test:smb\"\nportal-groups = [1]\n[[target.lun]]\n\
         path = \"data/disk.img\"\nsize = \"16M\"\n\n[smb]\nlisten = [\"127.0.0.1:{smb_port}\"]\n\n\
         [[share]]\nname = \"files\"\npath = \"share\"\n{extra}"
    );
    let path = dir.join("lanes.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn user_add_then_serve_a_share() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), port, "");
    add_carol(dir.path(), &cfg);
    let users = dir.path().join("data/smb-users");
    let mode = std::fs::metadata(&users).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let text = std::fs::read_to_string(&users).unwrap();
    // NTOWFv1("Password") as MS-NLMP 4.2.2.1.2 publishes it: MD4 over the UTF-16LE bytes.
    assert_eq!(text, "carol:a4f49c406510bdcab6824ee7c30fd852\n");

    let served = served::command()
        .args(["--config".as_ref(), cfg.as_os_str()])
        .start();
    let _ = &served;
    let local = dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(local.join("a.bin"), &data).unwrap();
    let out = Command::new("smbclient")
        .arg("//127.0.0.1/files")
        .args([
            "-p",
            &port.to_string(),
            "-U",
            "carol%Password",
            "-m",
            "SMB3",
        ])
        .args(["-c", "put a.bin a.bin; get a.bin b.bin; ls"])
        .current_dir(&local)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sha256(&dir.path().join("share/a.bin")),
        sha256(&local.join("a.bin"))
    );
    assert_eq!(sha256(&local.join("b.bin")), sha256(&local.join("a.bin")));
}

#[test]
fn share_errors_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), free_port(), "colour = \"red\"\n");
    let out = lanes()
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("lanes.toml:") && err.contains("colour"),
        "{err}"
    );
    // Missing users file: a clear error that names the command to create it.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), free_port(), "");
    let out = lanes()
        .current_dir(dir.path())
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lanes smb user add"), "{err}");
}

fn status_json(socket: &Path) -> serde_json::Value {
    let out = lanes()
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn metrics(port: u16) -> String {
    use std::io::{Read as _, Write as _};
    let mut http = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    http.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    http.read_to_string(&mut text).unwrap();
    text
}

/// `lanes status` and `/metrics` list a live SMB session with its channel (addresses, dialect,
/// signing, counters that moved), count a wrong password, and forget the session once the
/// client has gone.
#[test]
fn status_lists_smb_sessions_and_channels() {
    let dir = tempfile::tempdir().unwrap();
    let [port, metrics_port] = lanes_test_support::ports::free_ports();
    let cfg = config(dir.path(), port, "");
    add_carol(dir.path(), &cfg);
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let served = served::command()
        .args(["--config".as_ref(), cfg.as_os_str()])
        .args(["--metrics", metrics_addr.as_str()])
        .start();
    let socket = dir.path().join("data/lanes.sock");
    let before = status_json(&socket);
    assert_eq!(before["smb"]["sessions"], serde_json::json!([]), "{before}");

    // A wrong password: a logon failure, counted.
    let out = Command::new("smbclient")
        .arg("//127.0.0.1/files")
        .args(["-p", &port.to_string(), "-U", "carol%wrong", "-m", "SMB3"])
        .args(["-c", "ls"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");

    // An interactive client that stays connected while status is asked.
    let mut client = Command::new("smbclient")
        .arg("//127.0.0.1/files")
        .args([
            "-p",
            &port.to_string(),
            "-U",
            "carol%Password",
            "-m",
            "SMB3",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let stdin = client.stdin.as_mut().unwrap();
        stdin.write_all(b"ls\n").unwrap();
        stdin.flush().unwrap();
    }
    // smbclient's output is buffered while its stdin is a pipe: the server's own view tells
    // when the session has connected the share and listed it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let now = status_json(&socket);
        let listed = now["smb"]["sessions"].as_array().is_some_and(|s| {
            s.iter().any(|s| {
                s["trees"] == 1
                    && s["channels"][0]["requests"]
                        .as_u64()
                        .is_some_and(|r| r >= 8)
            })
        });
        if listed {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no session with a listed share: {now}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let live = status_json(&socket);
    let smb = &live["smb"];
    let sessions = smb["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{smb}");
    let s = &sessions[0];
    assert_eq!(s["user"], "carol");
    assert_eq!(s["dialect"], "3.1.1");
    assert!(
        ["AES-128-GMAC", "AES-128-CMAC"].contains(&s["signing"].as_str().unwrap()),
        "{s}"
    );
    assert_eq!(s["trees"], 1, "{s}");
    let channels = s["channels"].as_array().unwrap();
    assert_eq!(channels.len(), 1, "{s}");
    let ch = &channels[0];
    assert_eq!(ch["server"], format!("127.0.0.1:{port}"));
    assert!(ch["client"].as_str().unwrap().starts_with("127.0.0.1:"));
    // NEGOTIATE, two SESSION_SETUPs, TREE_CONNECT, and the listing's requests.
    assert!(ch["requests"].as_u64().unwrap() >= 8, "{ch}");
    assert!(ch["bytes_in"].as_u64().unwrap() > 0, "{ch}");
    assert!(ch["bytes_out"].as_u64().unwrap() > 0, "{ch}");
    assert!(ch["credits"].as_u64().unwrap() >= 1, "{ch}");
    assert_eq!(smb["counters"]["logon_failures"], 1, "{smb}");
    assert_eq!(smb["counters"]["sessions"], 1, "{smb}");
    assert_eq!(smb["counters"]["binds"], 0, "{smb}");

    let text = lanes()
        .args(["status", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(text.contains("SMB sessions (1)"), "{text}");
    assert!(text.contains("SMB channels (1)"), "{text}");

    let m = metrics(metrics_port);
    assert!(m.contains("\nlanes_smb_sessions 1\n"), "{m}");
    assert!(m.contains("\nlanes_smb_logon_failures_total 1\n"), "{m}");
    assert!(
        m.lines()
            .any(|l| l.starts_with("lanes_smb_channel_requests_total{")
                && l.contains("user=\"carol\"")
                && l.contains(&format!("server=\"127.0.0.1:{port}\""))),
        "{m}"
    );

    {
        use std::io::Write as _;
        client.stdin.as_mut().unwrap().write_all(b"quit\n").unwrap();
    }
    assert!(client.wait().unwrap().success());
    // The server sees the connection end on its own time: poll for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let after = status_json(&socket);
        if after["smb"]["sessions"] == serde_json::json!([])
            && after["smb"]["connections"] == serde_json::json!([])
        {
            assert_eq!(after["smb"]["counters"]["channels_lost"], 0, "{after}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the session outlived its client: {after}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(served);
}
