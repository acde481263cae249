//! A `lanes serve` child process for the binary's tests: started on a free loopback port with
//! a 64 MiB LUN in a temp dir, ready once its banner names the portal and the target.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A `lanes serve` child process, killed with SIGKILL on drop.
pub struct Served {
    pub child: Child,
    /// The first portal.
    pub portal: SocketAddr,
    /// Every portal, in banner order.
    #[allow(dead_code)]
    pub portals: Vec<SocketAddr>,
    #[allow(dead_code)]
    pub target: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(dead_code)]
pub fn serve(dir: &Path) -> Served {
    serve_on(dir, &["127.0.0.1:0"])
}

/// `lanes serve` with one portal per address (port 0: each gets a free port).
pub fn serve_on(dir: &Path, portals: &[&str]) -> Served {
    let lun = format!("{},size=64M", dir.join("disk.img").display());
    let data = dir.join("data").display().to_string();
    let mut args = vec!["serve"];
    for p in portals {
        args.extend(["--portal", p]);
    }
    args.extend(["--lun", &lun, "--data-dir", &data]);
    serve_with(&args)
}

/// `lanes ARGS...` (a `serve` command line), ready once its banner is out.
pub fn serve_with(args: &[&str]) -> Served {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lanes"));
    let mut child = cmd
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn lanes serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut portals: Vec<SocketAddr> = Vec::new();
        let mut target = None;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["Target", name] => target = Some(name.to_string()),
                ["portal", addr, "TPGT", _] => portals.extend(addr.parse::<SocketAddr>().ok()),
                _ => {}
            }
            if let (false, Some(t), true) =
                (portals.is_empty(), &target, line.starts_with("Status:"))
            {
                let _ = tx.send((portals.clone(), t.clone()));
            }
        }
    });
    let (portals, target) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("banner with portal and target within 60 s");
    Served {
        child,
        portal: portals[0],
        portals,
        target,
    }
}
