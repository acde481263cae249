//! A lanes SMB server in the test's runtime, listening on 127.0.0.1 and 127.0.0.2 with one
//! port, one share in a temporary directory.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use lanes_smb_client::ClientConfig;
use lanes_smb_server::{ShareConfig, SmbConfig, SmbServer, Users};

pub const USER: &str = "alice";
pub const PASS: &str = "wonder land";
/// The link speed the server is told to report, bits per second.
pub const LINK_SPEED: u64 = 10_000_000_000;

pub struct TestServer {
    pub server: SmbServer,
    pub addrs: Vec<SocketAddr>,
    pub share: PathBuf,
    pub dir: tempfile::TempDir,
}

/// A port free on 127.0.0.1 right now (the server binds it on both addresses).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub async fn start() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let mut users = Users::new();
    users.insert_password(USER, PASS);
    for attempt in 0.. {
        let port = free_port();
        let mut cfg = SmbConfig::new(dir.path());
        cfg.listen = vec![
            SocketAddr::from(([127, 0, 0, 1], port)),
            SocketAddr::from(([127, 0, 0, 2], port)),
        ];
        cfg.link_speed = Some(LINK_SPEED);
        cfg.rss = true;
        cfg.shares.push(ShareConfig {
            name: "share".into(),
            path: share.clone(),
            read_only: false,
            users: vec![],
        });
        match SmbServer::start(cfg, users.clone()).await {
            Ok(server) => {
                return TestServer {
                    addrs: server.addrs.clone(),
                    server,
                    share,
                    dir,
                }
            }
            Err(e) if attempt < 5 => eprintln!("port {port} taken ({e}), trying another"),
            Err(e) => panic!("server: {e}"),
        }
    }
    unreachable!()
}

pub fn config(password: &str) -> ClientConfig {
    ClientConfig::new(USER, password)
}

/// Deterministic pseudo-random bytes (xorshift).
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

pub fn sha256(b: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(b).into()
}
