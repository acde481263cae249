//! A tgtd child (the reference userspace target) with one LUN (LUN 1) and two portals on
//! loopback, 127.0.0.1 and 127.0.0.2 on one free port, for interop tests. tgtd reports only the
//! portal a discovery session came in on, so callers list both portals themselves.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const TGT_IQN: &str = "iqn.2026-11.test.lanes:tgt";

pub struct Tgt {
    child: Child,
    control: u16,
    pub portals: Vec<SocketAddr>,
    _dir: tempfile::TempDir,
}

fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn adm(control: u16, args: &[&str]) -> std::process::Output {
    Command::new("tgtadm")
        .arg("-C")
        .arg(control.to_string())
        .args(args)
        .output()
        .expect("tgtadm (the tgt package; scripts/test.sh installs it)")
}

impl Tgt {
    /// tgtd exporting a sparse file of `size_mib` MiB as LUN 1 of [`TGT_IQN`].
    pub fn start(size_mib: u64) -> Tgt {
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("tgt.img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(size_mib << 20))
            .expect("backing file");
        let port = free_port("127.0.0.1");
        let portals: Vec<SocketAddr> = vec![
            format!("127.0.0.1:{port}").parse().unwrap(),
            format!("127.0.0.2:{port}").parse().unwrap(),
        ];
        // A control port (a socket name under /var/run/tgtd) no other tgtd uses.
        let control = (0..100)
            .map(|k| 20000 + ((std::process::id() + u32::from(port) + k) % 12000) as u16)
            .find(|c| {
                !Path::new(&format!("/var/run/tgtd/socket.{c}")).exists()
                    && !Path::new(&format!("/var/run/tgtd/socket.{c}.lock")).exists()
            })
            .expect("a free tgtd control port");
        let log = dir.path().join("tgtd.log");
        let child = Command::new("tgtd")
            .args(["-f", "-C", &control.to_string(), "--iscsi"])
            .arg(format!("portal={}", portals[0]))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("tgtd log"))
            .spawn()
            .expect("tgtd (the tgt package; scripts/test.sh installs it)");
        let mut tgt = Tgt {
            child,
            control,
            portals,
            _dir: dir,
        };
        let start = Instant::now();
        let show = ["--lld", "iscsi", "--op", "show", "--mode", "target"];
        while !adm(control, &show).status.success() {
            let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
            if let Ok(Some(status)) = tgt.child.try_wait() {
                panic!("tgtd exited ({status}): {}", log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "tgtd did not come up: {}",
                log_text()
            );
            // Waiting for tgtd's control socket to appear; each try checks it.
            std::thread::sleep(Duration::from_millis(50));
        }
        let portal2 = format!("portal={}", tgt.portals[1]);
        for args in [
            vec![
                "--lld", "iscsi", "--op", "new", "--mode", "portal", "--param", &portal2,
            ],
            vec![
                "--lld", "iscsi", "--op", "new", "--mode", "target", "--tid", "1", "-T", TGT_IQN,
            ],
            vec![
                "--lld",
                "iscsi",
                "--op",
                "new",
                "--mode",
                "logicalunit",
                "--tid",
                "1",
                "--lun",
                "1",
                "-b",
                img.to_str().unwrap(),
            ],
            vec![
                "--lld", "iscsi", "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
            ],
        ] {
            let out = adm(tgt.control, &args);
            assert!(
                out.status.success(),
                "tgtadm {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        tgt
    }
}

impl Drop for Tgt {
    fn drop(&mut self) {
        let _ = adm(
            self.control,
            &[
                "--lld", "iscsi", "--op", "delete", "--mode", "target", "--tid", "1", "--force",
            ],
        );
        let _ = adm(self.control, &["--op", "delete", "--mode", "system"]);
        let start = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() {
            if start.elapsed() > Duration::from_secs(10) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for suffix in ["", ".lock"] {
            let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{}{suffix}", self.control));
        }
    }
}
