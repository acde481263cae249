//! A small real Ceph cluster for tests (`scripts/ceph-cluster`): one mon, one mgr and OSDs on
//! sparse files, bound to a loopback address of its own (127.77.x.y, so two test binaries
//! never share ports), in a temporary directory (in memory when there is room); stopped and
//! removed on drop.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Cluster {
    dir: tempfile::TempDir,
    /// The cluster's configuration file (monitor address, admin keyring).
    pub conf: PathBuf,
    pub addr: String,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster")
}

impl Cluster {
    /// Starts a cluster with `osds` OSDs and the pool `rbd` (about 5 s on 2 cores, in memory).
    pub fn start(osds: u32) -> Cluster {
        crate::require_root();
        // In memory when there is room (`scripts/ceph-cluster scratch` says why).
        let scratch = Command::new(script())
            .arg("scratch")
            .output()
            .expect("scripts/ceph-cluster scratch");
        let base = String::from_utf8_lossy(&scratch.stdout).trim().to_string();
        assert!(
            scratch.status.success() && !base.is_empty(),
            "scripts/ceph-cluster scratch: {}",
            String::from_utf8_lossy(&scratch.stderr)
        );
        let dir = tempfile::Builder::new()
            .prefix("lanes-ceph")
            .tempdir_in(&base)
            .expect("tempdir");
        let pid = std::process::id();
        let addr = format!("127.77.{}.{}", (pid >> 8) % 250 + 1, pid % 250 + 1);
        let out = Command::new(script())
            .arg("up")
            .arg(dir.path())
            .arg(&addr)
            .arg(osds.to_string())
            .output()
            .expect("scripts/ceph-cluster (the ceph-mon, ceph-osd, ceph-mgr packages)");
        assert!(
            out.status.success(),
            "ceph-cluster up failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = dir.path().join("ceph.conf");
        Cluster { dir, conf, addr }
    }

    /// `rbd ARGS...` against this cluster; panics with its output when it fails.
    pub fn rbd(&self, args: &[&str]) -> String {
        self.tool("rbd", args)
    }

    /// `ceph ARGS...` against this cluster (e.g. `osd blocklist add ADDR`).
    pub fn ceph(&self, args: &[&str]) -> String {
        self.tool("ceph", args)
    }

    /// `rados ARGS...` against this cluster (e.g. `-p rbd listwatchers OBJECT`).
    pub fn rados(&self, args: &[&str]) -> String {
        self.tool("rados", args)
    }

    fn tool(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new("timeout")
            .arg("60")
            .arg(program)
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program} (ceph-common): {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Restarts OSD `id` the hard way: kill -9, down for `down` (its placement groups have no
    /// other copy in a size-1 pool: their I/O waits), then started again on its data. Returns
    /// once the monitor has it up again, with how long that took from the kill.
    pub fn restart_osd(&self, id: u32, down: std::time::Duration) -> std::time::Duration {
        let pid_file = self.dir.path().join(format!("run/osd.{id}.pid"));
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()))
            .trim()
            .parse()
            .expect("a pid in the OSD's pid file");
        let killed = std::time::Instant::now();
        let killed_ok = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(killed_ok, "kill -9 osd.{id} ({pid})");
        // Gone, or a zombie: its files and sockets are closed then, and its reaper (the
        // daemon's parent exited when it forked) may take a second or more to collect it.
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
            })
        };
        while alive() {
            assert!(
                killed.elapsed() < std::time::Duration::from_secs(10),
                "osd.{id} exits"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // As its peers would report it (refused connections): down at once, so that the
        // restarted process has to come up again in the monitor's map.
        self.ceph(&["osd", "down", &id.to_string()]);
        std::thread::sleep(down.saturating_sub(killed.elapsed()));
        let out = Command::new("ceph-osd")
            .arg("-c")
            .arg(&self.conf)
            .args(["-i", &id.to_string()])
            .output()
            .expect("ceph-osd");
        assert!(
            out.status.success(),
            "ceph-osd -i {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Up in the monitor's map: clients send to it again. (The manager's placement group
        // view lags by its 5 s report interval, so it is not waited for.)
        loop {
            let dump = self.ceph(&["osd", "dump"]);
            let prefix = format!("osd.{id} up ");
            if dump.lines().any(|l| l.starts_with(&prefix)) {
                break;
            }
            assert!(
                killed.elapsed() < std::time::Duration::from_secs(120),
                "osd.{id} restarted but is not up"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        killed.elapsed()
    }

    /// A new image of `size` (e.g. `64M`) with only the layering feature (no exclusive-lock),
    /// as gateways that all write need.
    pub fn image(&self, name: &str, size: &str) -> String {
        let spec = format!("rbd/{name}");
        self.rbd(&[
            "create",
            &spec,
            "--size",
            size,
            "--image-feature",
            "layering",
        ]);
        spec
    }
}

impl Drop for Cluster {
    /// Stops the daemons and removes the directory; when the test is failing, the daemons'
    /// logs are kept first (their path printed), since they may say why.
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("down")
            .arg(self.dir.path())
            .status();
        if std::thread::panicking() {
            let keep = std::env::temp_dir().join(format!("lanes-ceph-logs-{}", std::process::id()));
            let copied = Command::new("cp")
                .arg("-r")
                .arg(self.dir.path().join("log"))
                .arg(&keep)
                .status()
                .is_ok_and(|s| s.success());
            if copied {
                eprintln!("the Ceph cluster's logs are kept in {}", keep.display());
            }
        }
    }
}

impl Cluster {
    /// `lanes serve` (BIN) as a gateway: target TARGET on 127.0.0.1 (a free port) with the
    /// image SPEC (`POOL/IMAGE`) of this cluster as LUN 0, its data in DATA_DIR.
    pub fn gateway(
        &self,
        bin: &str,
        target: &str,
        spec: &str,
        data_dir: &Path,
    ) -> crate::serve::ServeChild {
        crate::serve::ServeCommand::new(bin)
            .args(["--target-name", target, "--portal", "127.0.0.1:0"])
            .arg("--lun")
            .arg(format!("rbd:{spec},ceph-conf={}", self.conf.display()))
            .arg("--data-dir")
            .arg(data_dir)
            .inherit_stderr()
            .start()
    }
}
