//! The client against Samba's smbd on loopback (127.0.0.1, a free port, a configuration and
//! password database in a temporary directory): sign-in, a second channel bound to the same
//! (RSS-capable) address, 8 MiB written and read back, encryption, the interface list, a wrong
//! password. smbd advertises only addresses configured on an interface, so 127.0.0.2 is out.
//! Needs root (smbd needs a Unix account, so the share is used as root) and smbd (Debian's
//! samba, which scripts/test.sh installs): it fails without them, it does not skip.

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{pattern, sha256};
use lanes_smb_client::{ClientConfig, OpenOptions, Session};
use smb_proto::NtStatus;

const PASSWORD: &str = "interop-Pw1";

struct Smbd(Child);

impl Drop for Smbd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn require_root_and_smbd() {
    let root = std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false);
    assert!(root, "needs root: smbd serves the share as a Unix account");
    assert!(
        Command::new("smbd").arg("--version").output().is_ok(),
        "needs smbd (Debian package samba; scripts/test.sh installs it)"
    );
}

fn start_smbd(dir: &std::path::Path, port: u16) -> Smbd {
    for d in ["share", "private", "lock", "state", "cache", "pid", "log"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let b = dir.display();
    let conf = format!(
        "[global]\n server role = standalone server\n server min protocol = SMB3_11\n \
         server multi channel support = yes\n \
         interfaces = \"127.0.0.1;speed=1000000000,capability=RSS\"\n \
         bind interfaces only = yes\n smb ports = {port}\n disable netbios = yes\n \
         load printers = no\n printing = bsd\n printcap name = /dev/null\n disable spoolss = yes\n \
         passdb backend = tdbsam:{b}/private/passdb.tdb\n private dir = {b}/private\n \
         lock directory = {b}/lock\n state directory = {b}/state\n cache directory = {b}/cache\n \
         pid directory = {b}/pid\n log file = {b}/log/smbd.log\n ncalrpc dir = {b}/state/ncalrpc\n\n\
         [share]\n path = {b}/share\n read only = no\n"
    );
    let conf_path = dir.join("smb.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let mut p = Command::new("smbpasswd")
        .args(["-c"])
        .arg(&conf_path)
        .args(["-s", "-a", "root"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    p.stdin
        .take()
        .unwrap()
        .write_all(format!("{PASSWORD}\n{PASSWORD}\n").as_bytes())
        .unwrap();
    assert!(p.wait().unwrap().success());
    let child = Command::new("smbd")
        .args(["--foreground", "--no-process-group", "-s"])
        .arg(&conf_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let smbd = Smbd(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "smbd does not listen");
        std::thread::sleep(Duration::from_millis(100));
    }
    smbd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_samba() {
    require_root_and_smbd();
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _smbd = start_smbd(dir.path(), port);
    let a1 = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    for encrypt in [false, true] {
        let mut cfg = ClientConfig::new("root", PASSWORD);
        cfg.encrypt = encrypt;
        let s = Session::connect(a1, cfg).await.unwrap();
        assert_eq!(s.encrypted(), encrypt);
        let tree = s.tree_connect("127.0.0.1", "share").await.unwrap();
        let nics = tree.network_interfaces().await.unwrap();
        assert_eq!(nics.len(), 1, "{nics:?}");
        assert_eq!(nics[0].address.to_string(), "127.0.0.1");
        assert_eq!(nics[0].link_speed, 1_000_000_000);
        assert_ne!(nics[0].capability & 1, 0, "RSS");
        s.bind_channel(a1).await.unwrap();
        assert_eq!(s.channels().len(), 2);
        let f = tree
            .open("interop.bin", OpenOptions::READ_WRITE)
            .await
            .unwrap();
        let data = pattern(8 << 20, 11);
        let mut tasks = tokio::task::JoinSet::new();
        for (i, c) in data.chunks(1 << 20).enumerate() {
            let (f, c) = (f.clone(), c.to_vec());
            tasks.spawn(async move { f.write_at((i << 20) as u64, &c).await.unwrap() });
        }
        while let Some(r) = tasks.join_next().await {
            assert_eq!(r.unwrap(), 1 << 20);
        }
        let mut back = Vec::new();
        for i in 0..8u64 {
            back.extend_from_slice(&f.read_at(i << 20, 1 << 20).await.unwrap());
        }
        assert_eq!(sha256(&back), sha256(&data));
        assert!(
            s.channels().iter().all(|c| c.requests > 0),
            "{:?}",
            s.channels()
        );
        f.close().await.unwrap();
    }
    let err = Session::connect(a1, ClientConfig::new("root", "wrong"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.status(), Some(NtStatus::LOGON_FAILURE), "{err}");
}
