//! The initiator against a real in-process `lanes serve` on loopback: discovery, login, data
//! path (immediate data, unsolicited data, R2T), pipelining, CHAP.

use lanes_initiator::{discover, ChapSecret, Error, LoginOptions, Session};
use lanes_iscsi_target::config::ServeConfig;
use lanes_test_support::config::ConfigToml;
use std::net::SocketAddr;
use std::time::Duration;

const TARGET: &str = "iqn.2026-01.test.lanes:target";
const INITIATOR: &str = "iqn.2026-01.test.lanes:initiator";
const SECRET: &str = "a secret of sixteen";

struct Server {
    handle: Option<lanes_iscsi_target::ServerHandle>,
    _dir: tempfile::TempDir,
    addr: SocketAddr,
}

impl Server {
    async fn start(target_extra: &str) -> Server {
        Server::start_with("", target_extra).await
    }

    async fn start_with(server_extra: &str, target_extra: &str) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let toml = ConfigToml::new(dir.path().display(), TARGET)
            .server(server_extra)
            .target_lines(target_extra)
            .lun("disk0.img", "64M", "")
            .build();
        let config = ServeConfig::from_toml_str(&toml, &dir.path().join("lanes.toml"))
            .unwrap_or_else(|e| panic!("config: {e}"));
        let handle = lanes_iscsi_target::start(config)
            .await
            .expect("start target");
        let addr = handle.info.portals[0].1;
        Server {
            handle: Some(handle),
            _dir: dir,
            addr,
        }
    }

    async fn stop(mut self) {
        if let Some(h) = self.handle.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), h.stop()).await;
        }
    }
}

fn random(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

async fn login(addr: SocketAddr) -> Session {
    let s = Session::login(addr, TARGET, &LoginOptions::new(INITIATOR))
        .await
        .expect("login");
    s.test_unit_ready().await.expect("TEST UNIT READY");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn discovery_lists_the_target() {
    let server = Server::start("").await;
    let found = discover(server.addr, &LoginOptions::new(INITIATOR))
        .await
        .expect("discovery");
    let (name, portals) = found
        .iter()
        .find(|(n, _)| n == TARGET)
        .unwrap_or_else(|| panic!("target missing from {found:?}"));
    assert_eq!(name, TARGET);
    assert!(
        portals
            .iter()
            .any(|(a, tag)| *a == server.addr && *tag == 1),
        "{portals:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn write_and_read_round_trip_every_size() {
    let server = Server::start("").await;
    let s = login(server.addr).await;
    let n = s.negotiated();
    assert!(n.immediate_data && !n.initial_r2t, "{n:?}");
    let (blocks, bs) = s.read_capacity16().await.expect("capacity");
    assert_eq!((blocks, bs), (64 << 11, 512));
    let inquiry = s.inquiry(None).await.expect("inquiry");
    assert!(inquiry.len() >= 36);
    let mut lba = 0u64;
    // Immediate only, immediate + unsolicited, beyond FirstBurstLength (R2T), 1 MiB, odd sizes.
    for (i, size) in [
        512usize,
        4096,
        65536,
        200 * 1024,
        300 * 1024,
        1 << 20,
        2 << 20,
        3584,
    ]
    .into_iter()
    .enumerate()
    {
        let data = random(i as u64 + 1, size);
        s.write(lba, &data).await.expect("write");
        let back = s.read(lba, (size / 512) as u32).await.expect("read");
        assert!(back[..] == data[..], "size {size} differs");
        lba += (size / 512) as u64;
    }
    s.logout().await.expect("logout");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_pipelined_reads() {
    let server = Server::start("").await;
    let s = std::sync::Arc::new(login(server.addr).await);
    let data = random(7, 64 * 8192);
    s.write(0, &data).await.expect("write");
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move { (i, s.read(i * 16, 16).await) }));
    }
    for t in tasks {
        let (i, r) = t.await.expect("task");
        let got = r.expect("read");
        let at = (i * 8192) as usize;
        assert!(got[..] == data[at..at + 8192], "read {i} differs");
    }
    // Writes pipelined too, then read back.
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.write(4096 + i * 64, &random(100 + i, 32768)).await
        }));
    }
    for t in tasks {
        t.await.expect("task").expect("write");
    }
    for i in 0..64u64 {
        let got = s.read(4096 + i * 64, 64).await.expect("read");
        assert!(got[..] == random(100 + i, 32768)[..], "write {i} differs");
    }
    server.stop().await;
}

fn chap_toml() -> String {
    format!("[target.chap]\nuser = \"host1\"\nsecret = \"{SECRET}\"\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chap_login_and_wrong_secret() {
    let server = Server::start(&chap_toml()).await;
    let mut opts = LoginOptions::new(INITIATOR);
    opts.chap = Some(ChapSecret {
        user: "host1".into(),
        secret: SECRET.as_bytes().to_vec(),
    });
    let s = Session::login(server.addr, TARGET, &opts)
        .await
        .expect("CHAP login");
    s.test_unit_ready().await.expect("TUR");
    s.write(8, &random(3, 4096)).await.expect("write");
    s.logout().await.expect("logout");

    opts.chap = Some(ChapSecret {
        user: "host1".into(),
        secret: b"the wrong secret!".to_vec(),
    });
    match Session::login(server.addr, TARGET, &opts).await {
        Err(Error::LoginRefused {
            class: 2,
            detail: 1,
        }) => {}
        Err(e) => panic!("expected authentication failure, got {e}"),
        Ok(_) => panic!("login with a wrong secret succeeded"),
    }
    // No credentials at all against a CHAP target.
    match Session::login(server.addr, TARGET, &LoginOptions::new(INITIATOR)).await {
        Err(e @ (Error::LoginRefused { .. } | Error::Protocol(_))) => {
            assert!(!e.to_string().is_empty())
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("login without CHAP succeeded"),
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_target_and_unreachable_portal() {
    let server = Server::start("").await;
    match Session::login(
        server.addr,
        "iqn.2026-01.test.lanes:nope",
        &LoginOptions::new(INITIATOR),
    )
    .await
    {
        Err(Error::LoginRefused {
            class: 2,
            detail: 3,
        }) => {}
        other => panic!("expected target not found, got {:?}", other.err()),
    }
    server.stop().await;
    // A closed port on loopback: connection refused, promptly.
    let closed: SocketAddr = "127.0.0.1:1".parse().expect("addr");
    let r = Session::login(closed, TARGET, &LoginOptions::new(INITIATOR)).await;
    assert!(matches!(r, Err(Error::Io { .. })), "{:?}", r.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn target_pings_are_answered() {
    // The target pings after 100 ms idle and drops the connection after 1 s unanswered.
    let server = Server::start_with("nop-interval = \"100ms\"\nnop-timeout = \"1s\"", "").await;
    let s = login(server.addr).await;
    for round in 0..2u64 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let data = random(round, 4096);
        s.write(round * 8, &data).await.expect("write after idle");
        assert!(s.read(round * 8, 8).await.expect("read after idle")[..] == data[..]);
    }
    s.logout().await.expect("logout");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_connection_fails_commands_instead_of_hanging() {
    let server = Server::start("").await;
    let s = login(server.addr).await;
    server.stop().await;
    let r = tokio::time::timeout(Duration::from_secs(20), s.read(0, 8)).await;
    assert!(matches!(r, Ok(Err(_))), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ping_and_abortive_kill_end_every_command() {
    let server = Server::start("").await;
    let s = login(server.addr).await;
    let rtt = s.ping().await.expect("ping");
    assert!(rtt < Duration::from_secs(2), "ping took {rtt:?}");
    // Reads in flight when the path is killed end with a path error, none hangs.
    let s = std::sync::Arc::new(s);
    let mut reads = Vec::new();
    for i in 0..16u64 {
        let s = s.clone();
        reads.push(tokio::spawn(async move { s.read(i * 128, 128).await }));
    }
    s.kill();
    assert!(!s.is_alive());
    for r in reads {
        let r = tokio::time::timeout(Duration::from_secs(5), r)
            .await
            .expect("a command hung after kill")
            .expect("join");
        if let Err(e) = r {
            assert!(e.is_path_error(), "{e}");
        }
    }
    assert_eq!(s.outstanding(), 0);
    let e = s.ping().await.expect_err("ping on a killed session");
    assert!(matches!(e, Error::ConnectionLost), "{e}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identity_alua_and_reinstatement() {
    let server = Server::start("").await;
    let opts = LoginOptions::new(INITIATOR);
    let a = Session::login(server.addr, TARGET, &opts)
        .await
        .expect("login a");
    a.test_unit_ready().await.expect("tur");
    let id = a.device_identity().await.expect("page 0x83");
    let lun = id.lun.clone().expect("a LUN designator");
    assert!(lun.starts_with("naa."), "{lun}");
    assert_eq!(id.target_port_group, Some(1));
    let groups = a.report_target_port_groups().await.expect("RTPG");
    assert_eq!(groups.len(), 1);
    assert_eq!((groups[0].group, groups[0].tier()), (1, 0));
    // A leading login with the same initiator name and ISID reinstates: the target ends the
    // old session, which is how a failed path is fenced before its writes are replayed.
    let b = Session::login(server.addr, TARGET, &opts)
        .await
        .expect("login b");
    b.test_unit_ready().await.expect("tur on b");
    assert_eq!(b.device_identity().await.expect("0x83").lun, id.lun);
    let e = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Err(e) = a.ping().await {
                return e;
            }
        }
    })
    .await
    .expect("the reinstated session stayed up");
    assert!(e.is_path_error(), "{e}");
    b.logout().await.expect("logout");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fua_flush_zeroes_unmap_and_lun_reset() {
    let server = Server::start("").await;
    let s = login(server.addr).await;
    let data = bytes::Bytes::from(random(7, 64 * 512));
    s.write_fua(100, data.clone(), true)
        .await
        .expect("FUA write");
    s.synchronize_cache().await.expect("SYNCHRONIZE CACHE");
    assert_eq!(s.read(100, 64).await.expect("read"), data);
    s.write_zeroes(100, 16, false).await.expect("WRITE SAME");
    s.unmap(132, 16).await.expect("UNMAP");
    let back = s.read(100, 64).await.expect("read");
    assert!(back[..16 * 512].iter().all(|&b| b == 0));
    assert_eq!(back[16 * 512..32 * 512], data[16 * 512..32 * 512]);
    assert!(back[32 * 512..48 * 512].iter().all(|&b| b == 0));
    assert_eq!(back[48 * 512..], data[48 * 512..]);
    s.lun_reset().await.expect("LOGICAL UNIT RESET");
    // The reset's unit attention is consumed by the retry inside read.
    assert_eq!(
        s.read(148, 16).await.expect("read after reset"),
        data[48 * 512..]
    );
    let e = s
        .write_fua(0, bytes::Bytes::from(vec![0u8; 100]), false)
        .await
        .expect_err("unaligned write");
    assert!(!e.is_path_error());
    server.stop().await;
}
