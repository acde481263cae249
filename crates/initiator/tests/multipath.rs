//! The multipath device against an in-process `lanes serve` with two portals, each reached
//! through a relay that can black-hole it: identical LUN identifiers are required, I/O spreads
//! over both paths, and a black-holed path fails over with no error and no stale write.

mod support;

use bytes::Bytes;
use lanes_initiator::multipath::{MultipathConfig, PortalConfig};
use lanes_initiator::{LoginOptions, Multipath};
use lanes_iscsi_target::config::ServeConfig;
use lanes_test_support::config::ConfigToml;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::proxy::Proxy;

const TARGET: &str = "iqn.2026-01.test.lanes:mp";
const INITIATOR: &str = "iqn.2026-01.test.lanes:mp-host";
const BS: usize = 512;

struct Server {
    handle: Option<lanes_iscsi_target::ServerHandle>,
    _dir: tempfile::TempDir,
    portals: Vec<SocketAddr>,
}

async fn serve(serial: &str, size: &str) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = ConfigToml::new(dir.path().display(), TARGET)
        .portal_group(1, &["127.0.0.1:0", "127.0.0.2:0"])
        .lun("disk0.img", size, &format!("serial = \"{serial}\""))
        .build();
    let config = ServeConfig::from_toml_str(&toml, &dir.path().join("lanes.toml"))
        .unwrap_or_else(|e| panic!("config: {e}"));
    let handle = lanes_iscsi_target::start(config)
        .await
        .expect("start target");
    let portals = handle.info.portals.iter().map(|p| p.1).collect();
    Server {
        handle: Some(handle),
        _dir: dir,
        portals,
    }
}

impl Server {
    async fn stop(mut self) {
        if let Some(h) = self.handle.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), h.stop()).await;
        }
    }
}

fn config(portals: &[SocketAddr]) -> MultipathConfig {
    config_for(TARGET, 0, portals)
}

fn config_for(target: &str, lun: u64, portals: &[SocketAddr]) -> MultipathConfig {
    let portals = portals
        .iter()
        .map(|&addr| PortalConfig {
            addr,
            tpgt: 1,
            weight: 1,
            priority: 0,
            interface: None,
        })
        .collect();
    let mut login = LoginOptions::new(INITIATOR);
    login.lun = lun;
    let mut c = MultipathConfig::new(target, portals, login);
    c.no_path_timeout = Duration::from_secs(20);
    c
}

/// The content of version `v` of block `b`: every byte derived from both.
fn block(b: u64, v: u64) -> Vec<u8> {
    let mut out = vec![0u8; BS];
    for (i, chunk) in out.chunks_mut(16).enumerate() {
        chunk[..8].copy_from_slice(&b.to_le_bytes());
        chunk[8..].copy_from_slice(&(v ^ (i as u64) << 48).to_le_bytes());
    }
    out
}

async fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        // Polling a status snapshot; the condition is checked, not assumed after a delay.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn active_paths(mp: &Multipath) -> usize {
    mp.status().paths.iter().filter(|p| p.eligible).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_paths_carry_io_and_large_reads_are_split() {
    let server = serve("mp-a", "64M").await;
    let mp = Multipath::attach(config(&server.portals))
        .await
        .expect("attach");
    assert!(mp.lun_id().starts_with("naa."), "{}", mp.lun_id());
    assert_eq!(mp.size(), 64 << 20);
    wait_until("both paths active", Duration::from_secs(5), || {
        active_paths(&mp) == 2
    })
    .await;
    let data = Bytes::from(
        (0..(1usize << 20))
            .map(|i| (i * 7 % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    mp.write(1 << 20, data.clone(), false)
        .await
        .expect("write 1 MiB");
    let back = mp.read(1 << 20, 1 << 20).await.expect("read 1 MiB");
    assert_eq!(back, data);
    let st = mp.status();
    assert!(
        st.paths.iter().all(|p| p.completed > 0),
        "a 1 MiB request must be split over both paths: {:?}",
        st.paths.iter().map(|p| p.completed).collect::<Vec<_>>()
    );
    let e = mp.read(100, 512).await.expect_err("unaligned read");
    assert!(e.to_string().contains("aligned"), "{e}");
    let e = mp.read(64 << 20, 512).await.expect_err("read past the end");
    assert!(e.to_string().contains("beyond"), "{e}");
    mp.flush().await.expect("flush");
    mp.detach(Duration::from_secs(5)).await.expect("detach");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_path_to_another_lun_is_refused() {
    let a = serve("lun-a", "64M").await;
    let b = serve("lun-b", "64M").await;
    let mp = Multipath::attach(config(&[a.portals[0], b.portals[0]]))
        .await
        .expect("attach");
    assert_eq!(mp.refused().len(), 1);
    assert_eq!(mp.refused()[0].portal, b.portals[0]);
    assert!(
        mp.refused()[0].reason.contains("corrupt"),
        "{}",
        mp.refused()[0].reason
    );
    assert_eq!(mp.status().paths.len(), 1);
    mp.detach(Duration::from_secs(5)).await.expect("detach");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blackholed_path_fails_over_without_errors_or_stale_writes() {
    let server = serve("mp-fail", "64M").await;
    blackhole_failover(TARGET, 0, &server.portals, false).await;
    server.stop().await;
}

/// The same over one multi-connection session (MC/S): the failed connection is closed through
/// the other one and the CmdSN holes its lost commands left are filled before replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blackholed_connection_of_an_mcs_session_fails_over() {
    let server = serve("mp-mcs", "64M").await;
    blackhole_failover(TARGET, 0, &server.portals, true).await;
    server.stop().await;
}

/// tgt ends a session on reinstatement through its other portal too, so its failed paths are
/// fenced the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blackholed_path_fails_over_on_tgt() {
    let tgt = lanes_test_support::tgt::Tgt::start(64);
    blackhole_failover(lanes_test_support::tgt::TGT_IQN, 1, &tgt.portals, false).await;
}

async fn blackhole_failover(target: &str, lun: u64, portals: &[SocketAddr], mcs: bool) {
    blackhole_failover_groups(target, lun, portals, mcs, 1).await;
}

/// `tpgt2`: the portal group of the second portal (the first is in group 1).
async fn blackhole_failover_groups(
    target: &str,
    lun: u64,
    portals: &[SocketAddr],
    mcs: bool,
    tpgt2: u16,
) {
    // RUST_LOG=info shows the path state changes and fences when a run fails.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let p1 = Proxy::start("127.0.0.1:0", portals[0]).await;
    let p2 = Proxy::start("127.0.0.1:0", portals[1]).await;
    let mut cfg = config_for(target, lun, &[p1.addr, p2.addr]);
    cfg.mcs = mcs;
    cfg.portals[1].tpgt = tpgt2;
    let mp = Arc::new(Multipath::attach(cfg).await.expect("attach"));
    wait_until("both paths active", Duration::from_secs(5), || {
        active_paths(&mp) == 2
    })
    .await;

    // 16 writers, each owning its own blocks and writing them at queue depth 1: the last
    // acknowledged version of a block is exactly what must be read back.
    let stop = Arc::new(AtomicBool::new(false));
    let oracle: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let errors = Arc::new(AtomicU64::new(0));
    let worst = Arc::new(Mutex::new(Duration::ZERO));
    let mut workers = Vec::new();
    for w in 0..16u64 {
        let (mp, stop, oracle, errors, worst) = (
            mp.clone(),
            stop.clone(),
            oracle.clone(),
            errors.clone(),
            worst.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut v = 0u64;
            while !stop.load(Ordering::Relaxed) {
                v += 1;
                let b = w * 64 + (v * 13 % 64);
                let start = Instant::now();
                let r = if v.is_multiple_of(4) {
                    mp.read(b * BS as u64, BS as u32).await.map(|_| ())
                } else {
                    mp.write(b * BS as u64, Bytes::from(block(b, v)), false)
                        .await
                };
                let took = start.elapsed();
                {
                    let mut m = worst.lock().unwrap();
                    *m = (*m).max(took);
                }
                match r {
                    Ok(()) if !v.is_multiple_of(4) => {
                        oracle.lock().unwrap().insert(b, v);
                    }
                    Ok(()) => {}
                    Err(e) => {
                        eprintln!("worker {w}: {e}");
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let completed = || -> u64 { mp.status().paths.iter().map(|p| p.completed).sum() };
    let before = completed();
    wait_until("load running", Duration::from_secs(5), || {
        completed() > before + 500
    })
    .await;

    p1.blackhole();
    let failed_at = Instant::now();
    wait_until("path 0 declared failed", Duration::from_secs(5), || {
        mp.status().paths[0].state.starts_with("failed")
    })
    .await;
    let detection = failed_at.elapsed();
    wait_until("the failed path fenced", Duration::from_secs(10), || {
        mp.status().fences >= 1
    })
    .await;
    let after_fail = completed();
    wait_until("I/O continues on path 1", Duration::from_secs(5), || {
        completed() > after_fail + 500
    })
    .await;

    // Heal the path: whatever the initiator sent into the black hole now reaches the target.
    // The fence ended that session, so none of it may execute.
    p1.restore().await;
    wait_until("path 0 back in use", Duration::from_secs(10), || {
        let st = mp.status();
        st.paths[0].eligible && st.paths[0].completed > 0
    })
    .await;
    let back = mp.status().paths[0].completed;
    wait_until("path 0 carries I/O again", Duration::from_secs(10), || {
        mp.status().paths[0].completed > back + 200
    })
    .await;

    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker");
    }
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "application-visible errors"
    );
    let status = mp.status();
    eprintln!(
        "detection {detection:?}, worst request {:?}, replayed {}, fences {}",
        worst.lock().unwrap(),
        status.replayed,
        status.fences
    );
    // The oracle: every block holds the last acknowledged version, through either path.
    let oracle = oracle.lock().unwrap().clone();
    assert!(oracle.len() > 100);
    for (&b, &v) in &oracle {
        let got = mp
            .read(b * BS as u64, BS as u32)
            .await
            .expect("verify read");
        assert!(
            got.as_ref() == block(b, v).as_slice(),
            "block {b}: expected version {v}, found another (stale or lost write)"
        );
    }
    mp.detach(Duration::from_secs(5)).await.expect("detach");
}

/// Two portal groups (ALUA target port groups 1 and 2), one portal each.
async fn serve_two_groups(dir: &tempfile::TempDir) -> lanes_iscsi_target::ServerHandle {
    let toml = ConfigToml::new(dir.path().display(), TARGET)
        .portal_group(1, &["127.0.0.1:0"])
        .portal_group(2, &["127.0.0.2:0"])
        .lun("disk0.img", "64M", "")
        .build();
    let config = ServeConfig::from_toml_str(&toml, &dir.path().join("lanes.toml"))
        .unwrap_or_else(|e| panic!("config: {e}"));
    lanes_iscsi_target::start(config)
        .await
        .expect("start target")
}

fn alua(dir: &tempfile::TempDir, group: u16, state: &str) {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(dir.path().join("data/lanes.sock"))
        .expect("status socket");
    writeln!(s, r#"{{"cmd":"alua","group":{group},"state":"{state}"}}"#).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    assert!(line.contains("\"ok\":true"), "{line}");
}

/// A portal group moved to standby stops carrying I/O within about a second (no error reaches
/// the application: commands that meet the standby sense go to the other path), and carries
/// I/O again once it is back to active/optimized.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn alua_standby_moves_io_and_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = serve_two_groups(&dir).await;
    let portals: Vec<SocketAddr> = handle.info.portals.iter().map(|p| p.1).collect();
    let mut cfg = config(&portals);
    cfg.portals[1].tpgt = 2;
    let mp = Arc::new(Multipath::attach(cfg).await.expect("attach"));
    wait_until("both paths active", Duration::from_secs(5), || {
        active_paths(&mp) == 2
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for w in 0..8u64 {
        let (mp, stop, errors) = (mp.clone(), stop.clone(), errors.clone());
        workers.push(tokio::spawn(async move {
            let mut v = 0u64;
            while !stop.load(Ordering::Relaxed) {
                v += 1;
                let b = w * 64 + v % 64;
                if let Err(e) = mp
                    .write(b * BS as u64, Bytes::from(block(b, v)), false)
                    .await
                {
                    eprintln!("{e}");
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    alua(&dir, 2, "standby");
    wait_until("path 1 out of use", Duration::from_secs(3), || {
        let p = &mp.status().paths[1];
        !p.eligible && p.alua == "no-io"
    })
    .await;
    let idle = mp.status().paths[1].completed;
    let busy = mp.status().paths[0].completed;
    wait_until("I/O on path 0", Duration::from_secs(5), || {
        mp.status().paths[0].completed > busy + 300
    })
    .await;
    assert_eq!(
        mp.status().paths[1].completed,
        idle,
        "a standby path carried I/O"
    );
    alua(&dir, 2, "active-optimized");
    wait_until("path 1 back in use", Duration::from_secs(3), || {
        mp.status().paths[1].completed > idle + 100
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "application-visible errors"
    );
    mp.detach(Duration::from_secs(5)).await.expect("detach");
    let _ = tokio::time::timeout(Duration::from_secs(20), handle.stop()).await;
}

/// The failover policy uses only the highest-priority path; when it is black-holed the other
/// takes over, and with immediate failback the first is back once healed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_policy_prefers_priority_and_fails_back() {
    let server = serve("mp-prio", "64M").await;
    let p1 = Proxy::start("127.0.0.1:0", server.portals[0]).await;
    let p2 = Proxy::start("127.0.0.1:0", server.portals[1]).await;
    let mut cfg = config(&[p1.addr, p2.addr]);
    cfg.policy = mpath::Policy::Failover;
    cfg.portals[0].priority = 10;
    cfg.portals[1].priority = 1;
    let mp = Arc::new(Multipath::attach(cfg).await.expect("attach"));
    let reads = |n: u64| {
        let mp = mp.clone();
        async move {
            for i in 0..n {
                mp.read((i % 1000) * 512, 512).await.expect("read");
            }
        }
    };
    reads(200).await;
    let st = mp.status();
    assert!(
        st.paths[0].completed >= 200 && st.paths[1].completed == 0,
        "{:?}",
        st.paths
    );
    p1.blackhole();
    let (mp2, stop) = (mp.clone(), Arc::new(AtomicBool::new(false)));
    let stop2 = stop.clone();
    let load = tokio::spawn(async move {
        let mut i = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            i += 1;
            mp2.read((i % 1000) * 512, 512)
                .await
                .expect("read during failover");
        }
    });
    wait_until("path 1 takes over", Duration::from_secs(5), || {
        mp.status().paths[1].completed > 100
    })
    .await;
    p1.restore().await;
    let before = mp.status().paths[0].completed;
    wait_until("failback to path 0", Duration::from_secs(10), || {
        mp.status().paths[0].completed > before + 100
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    load.await.expect("load");
    let after = mp.status().paths[1].completed;
    reads(100).await;
    assert_eq!(
        mp.status().paths[1].completed,
        after,
        "failed back: path 1 idle again"
    );
    mp.detach(Duration::from_secs(5)).await.expect("detach");
    server.stop().await;
}

/// MC/S mechanics: a command lost on one connection leaves a CmdSN hole that stalls the
/// session; closing that connection from the other and filling the hole with a NOP-Out lets
/// the stalled command through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cmdsn_hole_is_plugged_through_another_connection() {
    let server = serve("mp-plug", "64M").await;
    let p1 = Proxy::start("127.0.0.1:0", server.portals[0]).await;
    let mut opts = LoginOptions::new(INITIATOR);
    opts.offer.max_connections = 2;
    let c1 = lanes_initiator::Session::login(p1.addr, TARGET, &opts)
        .await
        .expect("login");
    c1.test_unit_ready().await.expect("tur");
    let c2 = Arc::new(
        c1.add_connection(server.portals[1], TARGET, &opts, 2)
            .await
            .expect("second connection"),
    );
    c2.read(0, 1).await.expect("read on connection 2");
    p1.blackhole();
    let c1 = Arc::new(c1);
    let lost = {
        let c1 = c1.clone();
        tokio::spawn(async move { c1.read(8, 1).await })
    };
    // Wait until the lost command has taken its CmdSN.
    wait_until(
        "command outstanding on connection 1",
        Duration::from_secs(5),
        || c1.outstanding() == 1,
    )
    .await;
    let stalled = {
        let c2 = c2.clone();
        tokio::spawn(async move { c2.read(16, 1).await })
    };
    let taken = c1.kill();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert!(lost.await.unwrap().is_err());
    c2.logout_connection(1)
        .await
        .expect("logout of connection 1");
    let exp = c2.exp_cmd_sn();
    assert_eq!(exp, taken[0], "the target still waits for the lost CmdSN");
    c2.plug(taken[0]).await.expect("plug");
    let r = tokio::time::timeout(Duration::from_secs(5), stalled)
        .await
        .expect("the stalled read went through after the plug")
        .unwrap();
    assert_eq!(r.expect("read").len(), 512);
    server.stop().await;
}

/// With every path black-holed, I/O waits for the no-path timeout and then fails cleanly;
/// nothing hangs, and the device still detaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_every_path_down_io_fails_after_the_no_path_timeout() {
    let server = serve("mp-none", "64M").await;
    let p1 = Proxy::start("127.0.0.1:0", server.portals[0]).await;
    let p2 = Proxy::start("127.0.0.1:0", server.portals[1]).await;
    let mut cfg = config(&[p1.addr, p2.addr]);
    cfg.no_path_timeout = Duration::from_secs(2);
    let mp = Multipath::attach(cfg).await.expect("attach");
    mp.read(0, 512).await.expect("read while healthy");
    p1.blackhole();
    p2.blackhole();
    let start = Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(30), mp.read(4096, 4096))
        .await
        .expect("the read must not hang")
        .expect_err("no path: the read fails");
    let waited = start.elapsed();
    assert!(
        matches!(e, lanes_initiator::Error::NoPath { secs: 2 }),
        "{e}"
    );
    // It waited for a path (detection, then the no-path timeout) rather than failing at once.
    assert!(waited >= Duration::from_secs(2), "failed after {waited:?}");
    let _ = tokio::time::timeout(Duration::from_secs(10), mp.detach(Duration::from_secs(1))).await;
    server.stop().await;
}

/// Each portal its own portal group: no session can be reinstated through the other portal, so
/// the failed path is fenced with a LOGICAL UNIT RESET through the surviving one (after our own
/// commands are drained), and its writes are replayed with no error and no stale write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blackholed_path_in_its_own_portal_group_is_fenced_by_lun_reset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = serve_two_groups(&dir).await;
    let portals: Vec<SocketAddr> = handle.info.portals.iter().map(|p| p.1).collect();
    blackhole_failover_groups(TARGET, 0, &portals, false, 2).await;
    let _ = tokio::time::timeout(Duration::from_secs(20), handle.stop()).await;
}

/// A path that still answers pings but is far slower than the other is demoted: it stops
/// carrying I/O, with no error, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_path_is_demoted() {
    let server = serve("mp-slow", "64M").await;
    let p1 = Proxy::start("127.0.0.1:0", server.portals[0]).await;
    let p2 = Proxy::start("127.0.0.1:0", server.portals[1]).await;
    let mut cfg = config(&[p1.addr, p2.addr]);
    // Pings must not fail it: the slowness stays under three ping intervals.
    cfg.health.ping_interval = Duration::from_millis(250);
    let mp = Arc::new(Multipath::attach(cfg).await.expect("attach"));
    wait_until("both paths active", Duration::from_secs(5), || {
        active_paths(&mp) == 2
    })
    .await;
    p1.slow(60);
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for w in 0..8u64 {
        let (mp, stop, errors) = (mp.clone(), stop.clone(), errors.clone());
        workers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                if mp.read(((w * 997 + i) % 1000) * 512, 512).await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    wait_until("path 0 demoted", Duration::from_secs(5), || {
        mp.status().paths[0].state.starts_with("demoted")
    })
    .await;
    let st = mp.status();
    let reason = &st.paths[0].history.last().expect("a state change").reason;
    assert!(reason.contains("latency"), "{reason}");
    assert!(!st.paths[0].eligible);
    let idle = mp.status().paths[0].completed;
    let busy = mp.status().paths[1].completed;
    wait_until("I/O on path 1", Duration::from_secs(5), || {
        mp.status().paths[1].completed > busy + 500
    })
    .await;
    // At most the commands that were already queued on path 0 completed there.
    assert!(mp.status().paths[0].completed <= idle + 64);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    mp.detach(Duration::from_secs(5)).await.expect("detach");
    server.stop().await;
}
