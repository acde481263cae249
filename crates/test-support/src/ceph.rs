//! A small real Ceph cluster for tests (`scripts/ceph-cluster`): one mon, one mgr and OSDs on
//! sparse files, bound to a loopback address of its own (127.77.x.y, so two test binaries
//! never share ports), in a temporary directory; stopped and removed on drop.

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
    /// Starts a cluster with `osds` OSDs and the pool `rbd` (about 20 s on 2 cores).
    pub fn start(osds: u32) -> Cluster {
        crate::require_root();
        let dir = tempfile::Builder::new()
            .prefix("lanes-ceph")
            .tempdir()
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
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("down")
            .arg(self.dir.path())
            .status();
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
