//! `lanes reload` of the SMB part: a share added, one removed, a user added, all live. A tree
//! connected before the reload to a removed share answers NETWORK_NAME_DELETED, the removed
//! share cannot be connected again (BAD_NETWORK_NAME), an unchanged share's tree goes on, the
//! added share and user work at once; a change that needs a restart ([smb] listen) is refused
//! with its key and changes nothing.

mod served;

use std::path::Path;
use std::process::{Command, Output};

use lanes_smb_client::{ClientConfig, OpenOptions, Session};
use smb_proto::NtStatus;

fn lanes(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lanes"))
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The configuration with an iSCSI target, `[smb]` on `port` and one `[[share]]` per name
/// (each a directory of the same name).
fn write_config(dir: &Path, port: u16, shares: &[&str]) -> std::path::PathBuf {
    let mut t = format!(
        "[server]\ndata-dir = \"data\"\n\n[[portal-group]]\ntag = 1\nportals = [\"127.0.0.1:0\"]\n\n\
         [[target]]\nname = \"iqn.2026-11.io.lanes.test:smbreload\"\nportal-groups = [1]\n\
         [[target.lun]]\npath = \"data/disk.img\"\nsize = \"16M\"\n\n\
         [smb]\nlisten = [\"127.0.0.1:{port}\"]\n"
    );
    for s in shares {
        std::fs::create_dir_all(dir.join(s)).unwrap();
        t.push_str(&format!("\n[[share]]\nname = \"{s}\"\npath = \"{s}\"\n"));
    }
    let path = dir.join("lanes.toml");
    std::fs::write(&path, t).unwrap();
    path
}

fn add_user(dir: &Path, cfg: &Path, name: &str, password: &str) {
    let pw = dir.join(format!("pw-{name}"));
    std::fs::write(&pw, format!("{password}\n")).unwrap();
    let out = lanes(&[
        "smb",
        "user",
        "add",
        name,
        "--config",
        cfg.to_str().unwrap(),
        "--password-file",
        pw.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
}

fn status_of(e: lanes_smb_client::SmbError) -> Option<NtStatus> {
    e.status()
}

#[test]
fn reload_adds_and_removes_shares_and_users_without_ending_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(dir.path(), port, &["files", "old"]);
    add_user(dir.path(), &cfg, "carol", "Password");
    let served = served::command()
        .args(["--config".as_ref(), cfg.as_os_str()])
        .start();
    let socket = dir.path().join("data/lanes.sock");
    let socket_arg = socket.display().to_string();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let session = rt
        .block_on(Session::connect(
            addr,
            ClientConfig::new("carol", "Password"),
        ))
        .expect("logon");
    let files = rt
        .block_on(session.tree_connect("127.0.0.1", "files"))
        .expect("files");
    let old = rt
        .block_on(session.tree_connect("127.0.0.1", "old"))
        .expect("old");
    rt.block_on(old.open("a.txt", OpenOptions::READ_WRITE))
        .expect("a file on old");

    // "old" removed, "new" added, dave added to the users file; checked first.
    write_config(dir.path(), port, &["files", "new"]);
    add_user(dir.path(), &cfg, "dave", "Secret");
    let out = lanes(&["config", "check", cfg.to_str().unwrap()]);
    let checked = text(&out.stdout);
    assert!(out.status.success(), "{checked}{}", text(&out.stderr));
    assert!(checked.contains("2 SMB shares, 2 SMB users"), "{checked}");
    std::fs::remove_dir(dir.path().join("new")).unwrap();
    let out = lanes(&["config", "check", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("share[1].path"),
        "{}",
        text(&out.stderr)
    );
    std::fs::create_dir(dir.path().join("new")).unwrap();
    let out = lanes(&["reload", "--socket", &socket_arg]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("SMB share new added"), "{stdout}");
    assert!(stdout.contains("SMB share old removed"), "{stdout}");
    assert!(stdout.contains("SMB users: 2 (added dave)"), "{stdout}");
    assert!(!stdout.contains("SMB share files"), "unchanged: {stdout}");

    // The session stays; the removed share's tree is gone, the unchanged one goes on.
    let err = rt
        .block_on(old.open("a.txt", OpenOptions::READ_WRITE))
        .err()
        .expect("old is gone");
    assert_eq!(status_of(err), Some(NtStatus::NETWORK_NAME_DELETED));
    let err = rt
        .block_on(session.tree_connect("127.0.0.1", "old"))
        .err()
        .expect("old cannot be connected");
    assert_eq!(status_of(err), Some(NtStatus::BAD_NETWORK_NAME));
    let f = rt
        .block_on(files.open("b.txt", OpenOptions::READ_WRITE))
        .expect("files still served");
    rt.block_on(f.write_at(0, b"still here")).expect("write");
    let new = rt
        .block_on(session.tree_connect("127.0.0.1", "new"))
        .expect("new");
    rt.block_on(new.open("c.txt", OpenOptions::READ_WRITE))
        .expect("a file on new");
    assert!(dir.path().join("new/c.txt").exists());
    // dave logs on at once.
    let dave = rt
        .block_on(Session::connect(addr, ClientConfig::new("dave", "Secret")))
        .expect("dave logs on");
    rt.block_on(dave.tree_connect("127.0.0.1", "new"))
        .expect("dave on new");

    // A new listen port needs a restart: refused with its key, nothing changed.
    let other = free_port();
    write_config(dir.path(), other, &["files"]);
    let out = lanes(&["reload", "--socket", &socket_arg]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("smb.listen") && err.contains("restart") && err.contains("nothing changed"),
        "{err}"
    );
    rt.block_on(session.tree_connect("127.0.0.1", "new"))
        .expect("new still served after the refused reload");
    drop(served);
}
