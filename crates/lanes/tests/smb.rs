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
    std::fs::write(dir.path().join("pw"), "Password\n").unwrap();
    let out = lanes()
        .args(["smb", "user", "add", "carol", "--config"])
        .arg(&cfg)
        .arg("--password-file")
        .arg(dir.path().join("pw"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
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
