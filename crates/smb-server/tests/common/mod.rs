//! A server on 127.0.0.1 with a random port, one share in a temporary directory, and the
//! smbclient runner the tests share.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Output;

use lanes_smb_server::{ShareConfig, SmbConfig, SmbServer, Users};

pub const USER: &str = "alice";
pub const PASS: &str = "wonder land";

pub struct TestServer {
    pub runtime: tokio::runtime::Runtime,
    pub server: Option<SmbServer>,
    pub addr: SocketAddr,
    pub share: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            let _guard = self.runtime.enter();
            drop(s);
        }
    }
}

pub fn start() -> TestServer {
    start_with(|_| {})
}

pub fn start_with(adjust: impl FnOnce(&mut SmbConfig)) -> TestServer {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let mut cfg = SmbConfig::new(dir.path());
    cfg.listen = vec!["127.0.0.1:0".parse().unwrap()];
    cfg.shares.push(ShareConfig {
        name: "share".into(),
        path: share.clone(),
        read_only: false,
        users: vec![],
    });
    adjust(&mut cfg);
    let mut users = Users::new();
    users.insert_password(USER, PASS);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = runtime.block_on(SmbServer::start(cfg, users)).unwrap();
    let addr = server.addrs[0];
    TestServer {
        runtime,
        server: Some(server),
        addr,
        share,
        dir,
    }
}

/// Runs smbclient against `//127.0.0.1/SHARE` with `commands`, in directory `cwd`.
pub fn smbclient(
    addr: SocketAddr,
    share: &str,
    user: &str,
    pass: &str,
    cwd: &Path,
    commands: &str,
) -> Output {
    std::process::Command::new("smbclient")
        .arg(format!("//{}/{share}", addr.ip()))
        .args(["-p", &addr.port().to_string()])
        .args(["-U", &format!("{user}%{pass}")])
        .args(["-m", "SMB3"])
        .args(["--option=client min protocol=SMB3_11"])
        .args(["-c", commands])
        .current_dir(cwd)
        .output()
        .expect("smbclient runs (package smbclient)")
}

pub fn sha256(path: &Path) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(std::fs::read(path).unwrap()).into()
}

/// Deterministic pseudo-random bytes (xorshift), so a failure can be reproduced.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
