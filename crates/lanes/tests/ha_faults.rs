//! The HA pair's fault campaign: `lanes attach`'s multipath device over the pair's four paths
//! under a 4 KiB write+read load, and faults one after another, each healed before the next:
//! kill -9 of a node (restarted, resynced; the LUN's volatile cache keeps unflushed writes in
//! process memory, so each kill is a power loss), SIGSTOP of a node for a while, the replication link
//! down or black-holed, a node cut from etcd, etcd restarted, a node cut from everything, a node
//! cut from the host only (its peer and etcd still reach it). The oracle (ha_rig/oracle.rs) checks every read against the writes acknowledged before it began
//! (no lost write, no stale read, no torn or misplaced block); no request may fail; after each
//! fault both nodes must be Paired again and the host must have its four paths back; two nodes never acknowledge alone in one epoch (as
//! sampled from their status); at the end every block reads back as last acknowledged and both
//! backing files are identical. Meanwhile a second host registers reservation keys through the
//! node a fault spares (ha_rig/pr_probe.rs): after each heal all four paths must report the same
//! registrations, holding every key that was answered GOOD. And after each heal a third host
//! races COMPARE AND WRITEs through both nodes on one block (ha_rig/caw_probe.rs): exactly one
//! winner per round, its value read back through both nodes.
//!
//! `LANES_HA_FAULTS` sets the number of faults (default 100: the test command); the campaign
//! script `bench/ha-faults` runs 1,000. Needs root, ip, tc and etcd (fails, not skips, without
//! them). Traffic stays inside the lab's namespaces.

#[path = "ha_rig/caw_probe.rs"]
mod caw_probe;
mod ha_rig;
#[path = "ha_rig/load.rs"]
mod load;
#[path = "ha_rig/oracle.rs"]
mod oracle;
#[path = "ha_rig/pr_probe.rs"]
mod pr_probe;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caw_probe::CawProbe;
use ha_rig::*;
use lanes_test_support::serve::Signal;
use load::Load;
use pr_probe::PrProbe;

const WORKERS: u64 = 8;
const SLOTS: u64 = 64;
/// How long a fault lasts before it is healed.
const HOLD: Duration = Duration::from_millis(1500);
/// Bound for both nodes to be Paired again after a fault is healed.
const HEAL: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill(usize),
    Pause(usize),
    PeerDown,
    PeerBlackhole,
    EtcdCut(usize),
    EtcdRestart,
    Isolate(usize),
    HostCut(usize),
}

const KINDS: usize = 8;
/// COMPARE AND WRITE rounds raced through both nodes after each fault.
const CAW_ROUNDS: u64 = 10;

impl Fault {
    fn nth(i: usize) -> Fault {
        let node = 1 + (i / KINDS) % 2;
        match i % KINDS {
            0 => Fault::Kill(node),
            1 => Fault::Pause(node),
            2 => Fault::PeerDown,
            3 => Fault::PeerBlackhole,
            4 => Fault::EtcdCut(node),
            5 => Fault::EtcdRestart,
            6 => Fault::Isolate(node),
            _ => Fault::HostCut(node),
        }
    }

    /// The node a fault spares (either, when it hits both or neither alike).
    fn spared(self, i: usize) -> usize {
        match self {
            Fault::Kill(n)
            | Fault::Pause(n)
            | Fault::EtcdCut(n)
            | Fault::Isolate(n)
            | Fault::HostCut(n) => 3 - n,
            _ => 1 + i % 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Fault::Kill(_) => "kill -9 = power loss",
            Fault::Pause(_) => "SIGSTOP",
            Fault::PeerDown => "peer link down",
            Fault::PeerBlackhole => "peer link black hole",
            Fault::EtcdCut(_) => "node cut from etcd",
            Fault::EtcdRestart => "etcd restart",
            Fault::Isolate(_) => "node cut from everything",
            Fault::HostCut(_) => "node cut from the host",
        }
    }
}

fn relay() -> lanes_lab::RelayCommand {
    lanes_lab::RelayCommand(vec![
        env!("CARGO_BIN_EXE_lanes").into(),
        "lab".into(),
        "relay".into(),
    ])
}

/// Both nodes Paired (bounded); meanwhile no two nodes Alone in one epoch.
fn wait_paired(rig: &Rig, up: [bool; 2], violations: &Mutex<Vec<String>>) -> Duration {
    let start = Instant::now();
    loop {
        let views: Vec<(String, u64)> = [1, 2]
            .iter()
            .filter(|n| up[**n - 1])
            .map(|n| {
                let s = rig.status(*n);
                let p = &s["pairs"][0];
                (
                    p["role"].as_str().unwrap_or("?").to_string(),
                    p["epoch"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        if views.len() == 2
            && views[0].0 == "Alone"
            && views[1].0 == "Alone"
            && views[0].1 == views[1].1
        {
            violations
                .lock()
                .unwrap()
                .push(format!("both nodes Alone in epoch {}", views[0].1));
        }
        if views.len() == 2 && views.iter().all(|(r, _)| r == "Paired") {
            return start.elapsed();
        }
        if start.elapsed() >= HEAL {
            // Everything each node says about the pair, for the post-mortem.
            let full: Vec<String> = [1, 2]
                .iter()
                .filter(|n| up[**n - 1])
                .map(|n| format!("node {n}: {}", rig.status(*n)["pairs"][0]))
                .collect();
            panic!("not Paired again: {views:?}\n{}", full.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn faults_under_load_lose_no_acknowledged_write() {
    let faults: usize = std::env::var("LANES_HA_FAULTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    // Writes stay in process memory until a flush: every kill -9 is a power loss.
    let mut rig = pair_rig_with("hf", "volatile-cache = true\n");
    let mp = attach_four_paths(&mut rig);
    let load = Arc::new(Load::new(WORKERS, SLOTS));
    let workers = rig.in_host({
        let (mp, load) = (mp.clone(), load.clone());
        async move {
            (0..WORKERS)
                .map(|w| tokio::spawn(load.clone().worker(mp.clone(), w)))
                .collect::<Vec<_>>()
        }
    });
    load.progress(1000, "load before the first fault");
    let lab = rig.lab.clone();
    let mut per_kind: std::collections::BTreeMap<&str, (u32, Duration, Duration)> =
        Default::default();
    let campaign = Instant::now();
    let mut probe = PrProbe::default();
    let mut caw = CawProbe::default();
    for i in 0..faults {
        let fault = Fault::nth(i);
        *load.worst.lock().unwrap() = Duration::ZERO;
        let mut up = [true, true];
        // While the fault holds: a reservation change through a portal of the spared node.
        let mut change_pr = |rig: &mut Rig| {
            let portal = (fault.spared(i) - 1) * 2 + (i / 2) % 2;
            let mut p = std::mem::take(&mut probe);
            probe = rig.in_host(async move {
                p.change(portal, i as u64 + 1).await;
                p
            });
        };
        match fault {
            Fault::Kill(n) => {
                rig.serves[n - 1]
                    .as_mut()
                    .unwrap()
                    .stop(Signal::Kill, Duration::from_secs(10))
                    .expect("the node exits on SIGKILL");
                rig.serves[n - 1] = None;
                up[n - 1] = false;
                rig.wait_role(3 - n, "Alone", HEAL);
                change_pr(&mut rig);
                load.progress(200, "load with one node");
                rig.start(n);
                up[n - 1] = true;
            }
            Fault::Pause(n) => {
                rig.serves[n - 1].as_ref().unwrap().pause();
                up[n - 1] = false;
                let held = Instant::now();
                change_pr(&mut rig);
                std::thread::sleep(HOLD.saturating_sub(held.elapsed()));
                rig.serves[n - 1].as_ref().unwrap().resume();
                up[n - 1] = true;
            }
            Fault::PeerDown
            | Fault::PeerBlackhole
            | Fault::EtcdCut(_)
            | Fault::Isolate(_)
            | Fault::HostCut(_) => {
                let (target, mode) = match fault {
                    Fault::PeerDown => ("peer1".to_string(), "down"),
                    Fault::PeerBlackhole => ("peer1".to_string(), "blackhole"),
                    Fault::EtcdCut(n) => (format!("witness{n}"), "blackhole"),
                    Fault::Isolate(n) => (format!("node{n}"), "blackhole"),
                    Fault::HostCut(n) => (format!("front{n}"), "blackhole"),
                    _ => unreachable!(),
                };
                lanes_lab::fail(&lab, &target, mode, &relay()).expect("fault");
                let held = Instant::now();
                change_pr(&mut rig);
                std::thread::sleep(HOLD.saturating_sub(held.elapsed()));
                lanes_lab::restore(&lab, &target).expect("restore");
            }
            Fault::EtcdRestart => {
                lanes_lab::witness(&lab, lanes_lab::run::WitnessAction::Restart)
                    .expect("etcd restart");
                change_pr(&mut rig);
            }
        }
        let heal = wait_paired(&rig, up, &load.violations);
        // Healed means the host has all four paths again too: the next fault may take any.
        let paths = Instant::now();
        while !mp.status().paths.iter().all(|p| p.eligible) {
            assert!(
                paths.elapsed() < HEAL,
                "fault {i} ({fault:?}): paths not back: {:?}",
                mp.status().paths
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let heal = heal + paths.elapsed();
        // The reservations as every path reports them.
        let mut p = std::mem::take(&mut probe);
        let (p, checked) = rig.in_host(async move {
            let r = p.check().await;
            (p, r)
        });
        probe = p;
        // COMPARE AND WRITE rounds through both nodes.
        let mut c = std::mem::take(&mut caw);
        let (c, raced) = rig.in_host(async move {
            let r = c.race(i, CAW_ROUNDS).await;
            (c, r)
        });
        caw = c;
        for why in [checked.err(), raced.err()].into_iter().flatten() {
            load.violations
                .lock()
                .unwrap()
                .push(format!("fault {i} ({fault:?}): {why}"));
        }
        load.progress(100, "load after the fault");
        let worst = *load.worst.lock().unwrap();
        let e = per_kind.entry(fault.name()).or_default();
        e.0 += 1;
        e.1 = e.1.max(worst);
        e.2 = e.2.max(heal);
        let violations = load.violations.lock().unwrap().clone();
        assert!(
            violations.is_empty() && load.errors.load(Ordering::Relaxed) == 0,
            "fault {i} ({fault:?}): {} errors, violations {violations:?}",
            load.errors.load(Ordering::Relaxed)
        );
        if (i + 1) % 100 == 0 {
            println!(
                "progress: {} faults in {:?}, {} requests, 0 errors, 0 violations so far",
                i + 1,
                campaign.elapsed(),
                load.done.load(Ordering::Relaxed)
            );
        }
    }
    load.stop.store(true, Ordering::Relaxed);
    rig.in_host(async move {
        for w in workers {
            w.await.unwrap();
        }
    });
    println!(
        "campaign: {faults} faults in {:?}, {} requests, 0 errors, 0 violations; \
         {} reservation changes ({} not answered GOOD), registrations identical on all 4 paths after every fault; \
         {} COMPARE AND WRITE rounds through both nodes, at most one landing each \
         ({} with an answer NOT READY, its outcome read back)",
        campaign.elapsed(),
        load.done.load(Ordering::Relaxed),
        probe.changes,
        probe.unanswered,
        caw.rounds,
        caw.unknown,
    );
    for (kind, (n, worst, heal)) in &per_kind {
        println!("  {kind:28} {n:4} faults, longest request {worst:?}, longest heal (Paired, 4 paths) {heal:?}");
    }
    // Every block as last acknowledged, read through the host's device.
    let slots = load.slots.lock().unwrap().clone();
    let violations = rig.in_host(async move {
        // SYNCHRONIZE CACHE through the pair makes both replicas durable: the volatile caches
        // reach the backing files, which are compared below.
        mp.flush().await.expect("flush");
        let mut bad = Vec::new();
        for (i, slot) in slots.iter().enumerate() {
            let offset = i as u64 * BS as u64;
            let got = mp.read(offset, BS as u32).await.expect("final read");
            let w = i as u64 / SLOTS;
            if let Err(why) = oracle::decode(&got, offset).and_then(|s| slot.check(&s, w, offset)) {
                bad.push(why);
            }
        }
        bad
    });
    assert!(violations.is_empty(), "final read-back: {violations:?}");
    // Both replicas identical once the load stopped, everything was flushed and the pair is
    // Paired.
    wait_paired(&rig, [true, true], &load.violations);
    let files = [1, 2].map(|n| rig.node_dir(n).join("disk0.img"));
    assert_eq!(
        crc_of(&files[0]),
        crc_of(&files[1]),
        "the two replicas differ"
    );
}
