//! `lanes attach`'s multipath device in the lab: `lanes serve` in a storage namespace with one
//! portal per emulated 1GbE link, the device in the host namespace, and a real black hole
//! (`lanes lab fail LINK --mode blackhole`: packets vanish, no reset). Under a mixed 4K/64K
//! read/write load at queue depth 32 every trial must fail over with zero application-visible
//! errors, and afterwards every block must read back as last acknowledged (an oracle).
//!
//! Needs root, ip and tc (fails, not skips, without them). `LANES_FAILOVER_TRIALS` (default 3)
//! and `LANES_FAILOVER_JSON` (a file for the per-trial times) turn the same test into the
//! failover benchmark that `bench/multipath` runs.

use lanes_test_support::require_root;
use lanes_test_support::serve::{ServeChild, ServeCommand};

use bytes::Bytes;
use lanes_initiator::multipath::{MultipathConfig, PortalConfig};
use lanes_initiator::{LoginOptions, Multipath};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PORT: u16 = 3260;
const TARGET: &str = "iqn.2026-11.io.lanes:vm";
const SLOT: u64 = 64 << 10;

/// The lab and the target inside it, removed however the test ends.
struct Rig {
    lab: String,
    serve: Option<ServeChild>,
    dir: tempfile::TempDir,
    portals: Vec<SocketAddr>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.serve = None;
        let _ = lanes_lab::down(&self.lab);
        let _ = &self.dir;
    }
}

fn relay() -> lanes_lab::RelayCommand {
    lanes_lab::RelayCommand(vec![
        env!("CARGO_BIN_EXE_lanes").into(),
        "lab".into(),
        "relay".into(),
    ])
}

impl Rig {
    fn up(tag: &str, nics: usize) -> Rig {
        Rig::up_with(tag, nics, lanes_lab::Topology::Pathing)
    }

    fn up_with(tag: &str, nics: usize, topology: lanes_lab::Topology) -> Rig {
        require_root();
        let lab = format!("a{}-{tag}", std::process::id());
        let _ = lanes_lab::down(&lab);
        let options = lanes_lab::Options {
            name: lab.clone(),
            topology,
            nics,
            storage_nics: nics,
            rate: "1gbit".parse().expect("rate"),
            storage_nodes: 1,
            mtu: 1500,
            pair: Default::default(),
        };
        let state = lanes_lab::up(&options, &AtomicBool::new(false)).expect("lab up");
        let storage: Vec<Ipv4Addr> = state
            .plan
            .nics
            .iter()
            .filter(|n| n.namespace == "node1" || n.namespace.ends_with("-node1"))
            .map(|n| n.address)
            .collect();
        assert_eq!(storage.len(), nics, "storage addresses: {storage:?}");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rig = Rig {
            lab: lab.clone(),
            serve: None,
            dir,
            portals: storage
                .iter()
                .map(|a| SocketAddr::from((*a, PORT)))
                .collect(),
        };
        let serve = ServeCommand::new(env!("CARGO_BIN_EXE_lanes"))
            .in_namespace(&lanes_lab::plan::real_namespace(&lab, "node1"))
            .portals(&rig.portals)
            .disk(rig.dir.path(), "disk.img", "256M")
            .inherit_stderr()
            .start();
        rig.serve = Some(serve);
        rig
    }

    /// Runs `f` on a tokio runtime whose threads live in the lab's host namespace, so every
    /// socket the initiator opens is the host's.
    fn in_host<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        let path = format!(
            "/run/netns/{}",
            lanes_lab::plan::real_namespace(&self.lab, "host")
        );
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("host namespace");
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns host");
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(f)
        })
        .join()
        .expect("host thread")
    }
}

fn config(portals: &[SocketAddr]) -> MultipathConfig {
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
    MultipathConfig::new(
        TARGET,
        portals,
        LoginOptions::new("iqn.2026-11.io.lanes:lab-host"),
    )
}

/// Version `v` of the data at `offset`, `len` bytes: every 16 bytes name both.
fn pattern(offset: u64, v: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for (i, c) in out.chunks_mut(16).enumerate() {
        c[..8].copy_from_slice(&(offset + 16 * i as u64).to_le_bytes());
        c[8..].copy_from_slice(&v.to_le_bytes());
    }
    out
}

#[derive(Debug, Clone, serde::Serialize)]
struct Trial {
    link: String,
    /// Black hole until the path is declared failed.
    detection_ms: f64,
    /// Longest an application request waited during the trial (the failover stall).
    stall_ms: f64,
    /// Restore until the path carries I/O again.
    back_in_use_ms: f64,
}

struct Load {
    stop: Arc<AtomicBool>,
    errors: Arc<AtomicU64>,
    worst: Arc<Mutex<Duration>>,
    oracle: Arc<Mutex<HashMap<u64, (u64, usize)>>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

/// 32 workers at queue depth 1 each: even ones 4 KiB, odd ones 64 KiB, 2 of 3 requests
/// writes. Each worker owns its slots, so the last acknowledged version is what must be there.
fn start_load(mp: &Arc<Multipath>) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let worst = Arc::new(Mutex::new(Duration::ZERO));
    let oracle: Arc<Mutex<HashMap<u64, (u64, usize)>>> = Arc::default();
    let workers = (0..32u64)
        .map(|w| {
            let (mp, stop, errors, worst, oracle) = (
                mp.clone(),
                stop.clone(),
                errors.clone(),
                worst.clone(),
                oracle.clone(),
            );
            tokio::spawn(async move {
                let len = if w % 2 == 0 { 4096usize } else { 65536 };
                let mut v = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    v += 1;
                    let offset = (w * 32 + v * 7 % 32) * SLOT;
                    let start = Instant::now();
                    let write = !v.is_multiple_of(3);
                    let r = if write {
                        mp.write(offset, Bytes::from(pattern(offset, v, len)), false)
                            .await
                    } else {
                        mp.read(offset, len as u32).await.map(|_| ())
                    };
                    let took = start.elapsed();
                    {
                        let mut m = worst.lock().unwrap();
                        *m = (*m).max(took);
                    }
                    match r {
                        Ok(()) if write => {
                            oracle.lock().unwrap().insert(offset, (v, len));
                        }
                        Ok(()) => {}
                        Err(e) => {
                            eprintln!("worker {w}: {e}");
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    Load {
        stop,
        errors,
        worst,
        oracle,
        workers,
    }
}

async fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        // Polling the device's status snapshot; the condition is checked, not assumed.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

fn completed(mp: &Multipath, path: usize) -> u64 {
    mp.status().paths[path].completed
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

#[test]
fn blackhole_failover_in_the_lab_loses_nothing() {
    let trials: usize = std::env::var("LANES_FAILOVER_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(3);
    let results = lab_failover("fo", trials, false);
    if let Ok(path) = std::env::var("LANES_FAILOVER_JSON") {
        std::fs::write(&path, serde_json::to_string_pretty(&results).unwrap()).expect("write JSON");
    }
}

/// The same with one multi-connection session (`--mcs`): the failed connection is closed
/// through the other and its CmdSN holes are filled before the replay.
#[test]
fn mcs_blackhole_failover_in_the_lab_loses_nothing() {
    lab_failover("mcs", 2, true);
}

fn lab_failover(tag: &str, trials: usize, mcs: bool) -> Vec<Trial> {
    let rig = Rig::up(tag, 2);
    let lab = rig.lab.clone();
    let portals = rig.portals.clone();
    rig.in_host(async move {
        let mut cfg = config(&portals);
        cfg.mcs = mcs;
        let mp = Arc::new(Multipath::attach(cfg).await.expect("attach"));
        wait_until("both paths in use", Duration::from_secs(5), || {
            mp.status().paths.iter().all(|p| p.eligible)
        })
        .await;
        let load = start_load(&mp);
        let mut results = Vec::new();
        for t in 0..trials {
            let path = t % 2;
            let link = format!("link{}", path + 1);
            let (c0, c1) = (completed(&mp, 0), completed(&mp, 1));
            wait_until("load on both paths", Duration::from_secs(10), || {
                completed(&mp, 0) > c0 + 200 && completed(&mp, 1) > c1 + 200
            })
            .await;
            *load.worst.lock().unwrap() = Duration::ZERO;
            let lab2 = lab.clone();
            let l2 = link.clone();
            tokio::task::spawn_blocking(move || lanes_lab::fail(&lab2, &l2, "blackhole", &relay()))
                .await
                .unwrap()
                .expect("blackhole");
            let holed = Instant::now();
            wait_until("the path declared failed", Duration::from_secs(5), || {
                !mp.status().paths[path].state.starts_with("active")
            })
            .await;
            let detection = holed.elapsed();
            let other = 1 - path;
            let c = completed(&mp, other);
            wait_until(
                "I/O continues on the other path",
                Duration::from_secs(5),
                || completed(&mp, other) > c + 500,
            )
            .await;
            let stall = *load.worst.lock().unwrap();
            let (lab2, l2) = (lab.clone(), link.clone());
            tokio::task::spawn_blocking(move || lanes_lab::restore(&lab2, &l2))
                .await
                .unwrap()
                .expect("restore");
            let restored = Instant::now();
            let before = completed(&mp, path);
            wait_until("the path back in use", Duration::from_secs(15), || {
                let st = mp.status();
                st.paths[path].eligible && st.paths[path].completed > before + 50
            })
            .await;
            let trial = Trial {
                link,
                detection_ms: ms(detection),
                stall_ms: ms(stall),
                back_in_use_ms: ms(restored.elapsed()),
            };
            eprintln!("trial {t}: {trial:?}");
            results.push(trial);
        }
        load.stop.store(true, Ordering::Relaxed);
        for w in load.workers {
            w.await.expect("worker");
        }
        assert_eq!(
            load.errors.load(Ordering::Relaxed),
            0,
            "application-visible errors"
        );
        let oracle = load.oracle.lock().unwrap().clone();
        assert!(oracle.len() > 500, "only {} slots written", oracle.len());
        for (&offset, &(v, len)) in &oracle {
            let got = mp.read(offset, len as u32).await.expect("verify read");
            assert!(
                got.as_ref() == pattern(offset, v, len).as_slice(),
                "{len} bytes at {offset}: expected version {v}, found another (stale or lost write)"
            );
        }
        let st = mp.status();
        assert!(
            st.fences as usize >= trials,
            "every failed path fenced: {} < {trials}",
            st.fences
        );
        mp.detach(Duration::from_secs(10)).await.expect("detach");
        results
    })
}

/// Bytes sent by a NIC of the lab's host namespace.
fn tx_bytes(lab: &str, nic: &str) -> u64 {
    let ns = lanes_lab::plan::real_namespace(lab, "host");
    let out = std::process::Command::new("ip")
        .args(["-n", &ns, "-j", "-s", "link", "show", "dev", nic])
        .output()
        .expect("ip -s link");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip JSON");
    v[0]["stats64"]["tx"]["bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no tx bytes for {nic}: {v}"))
}

/// In a mesh every NIC is on one subnet, so the routing table sends every path out through
/// one NIC (seed 003's lost throughput). `--bind` gives each path its own NIC.
#[test]
fn bound_paths_in_a_mesh_each_use_their_own_nic() {
    let rig = Rig::up_with("mesh", 2, lanes_lab::Topology::Mesh);
    for bind in [false, true] {
        let (lab, portals) = (rig.lab.clone(), rig.portals.clone());
        let before = [tx_bytes(&lab, "link1"), tx_bytes(&lab, "link2")];
        rig.in_host(async move {
            let mut cfg = config(&portals);
            if bind {
                cfg.portals[0].interface = Some("link1".into());
                cfg.portals[1].interface = Some("link2".into());
            }
            let mp = Multipath::attach(cfg).await.expect("attach");
            assert_eq!(mp.status().paths.len(), 2);
            // 64 MiB of 1 MiB writes, each split over both paths.
            let data = Bytes::from(vec![0x5a; 1 << 20]);
            for i in 0..64u64 {
                mp.write(i << 20, data.clone(), false).await.expect("write");
            }
            mp.detach(Duration::from_secs(10)).await.expect("detach");
        });
        let sent = [
            tx_bytes(&rig.lab, "link1") - before[0],
            tx_bytes(&rig.lab, "link2") - before[1],
        ];
        eprintln!("bind {bind}: sent {sent:?} bytes on link1, link2");
        if bind {
            assert!(
                sent.iter().all(|&b| b > 16 << 20),
                "with --bind both NICs carry the writes: {sent:?}"
            );
        } else {
            assert!(
                sent.iter().any(|&b| b < 1 << 20),
                "without binding one NIC carries everything (the mesh problem): {sent:?}"
            );
        }
    }
}
