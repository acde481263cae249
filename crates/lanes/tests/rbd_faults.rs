//! The HA pair's fault campaign, on RBD gateways: three `lanes serve` gateways over one image
//! of a real Ceph cluster (Debian's packages, on a loopback address of the test's own), each
//! its own portal group on 127.0.0.1, and `lanes attach`'s multipath device over the three
//! paths under a 4 KiB write+read load. Faults one after another, each healed before the next:
//! kill -9 of a gateway (restarted on the same portal a second later, as systemd restarts
//! lanes.service: the new process fences its predecessor's client as it starts), SIGSTOP of a gateway (short: resumed
//! before its watch times out; long: past it, so the next reset or reservation change fences
//! it), a gateway cut from the host (its portal black-holed with nftables, both ways), a
//! gateway cut from the cluster for 4 s, and kill -9 of an OSD, restarted a second later (in
//! the size-1 pool half the image waits for it on every gateway at once). A gateway that the
//! cluster fenced (its port group unavailable) must come back by itself with a new client: the
//! heal waits for it.
//!
//! The oracle is the pair's (ha_rig/oracle.rs): every read against the writes acknowledged
//! before it began (no lost write, no stale read, no torn or misplaced block); no request may
//! fail. While each fault holds, a second host registers a reservation key through a gateway
//! the fault spares (ha_rig/pr_probe.rs): after each heal every gateway reports the same
//! registrations, and every gateway's port group active/optimized through every gateway
//! (REPORT TARGET PORT GROUPS). After each heal a third host races COMPARE AND WRITEs through two gateways
//! (ha_rig/caw_probe.rs): exactly one winner per round. At the end every block reads back as
//! last acknowledged.
//!
//! Each gateway runs as a user of its own, so that nftables can cut one off from the cluster
//! (`meta skuid`): it stays up and reachable by its hosts, but its storage hangs and its watch
//! times out. The gateways meet only through RADOS, so that is also the cut from the other
//! gateways.
//!
//! `LANES_RBD_FAULTS` sets the number of faults (default 100: the test command); the campaign
//! script `bench/rbd-faults` runs more. Root only (nftables, the cluster). Traffic stays on
//! loopback: the cluster's own address and 127.0.0.1.

// The pair's own entry point (`race`, through its nodes' portals) is not used here.
#[allow(dead_code)]
#[path = "ha_rig/caw_probe.rs"]
mod caw_probe;
#[path = "ha_rig/load.rs"]
mod load;
#[path = "ha_rig/oracle.rs"]
mod oracle;
#[path = "ha_rig/pr_probe.rs"]
mod pr_probe;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use caw_probe::CawProbe;
use lanes_initiator::multipath::{MultipathConfig, PortalConfig};
use lanes_initiator::{LoginOptions, Multipath, Session};
use lanes_test_support::ceph::Cluster;
use lanes_test_support::serve::{ServeChild, ServeCommand, Signal};
use load::Load;
use pr_probe::PrProbe;

/// The target every gateway exports (the probes log in to it).
const TARGET: &str = "iqn.2026-11.io.lanes:rbd-faults";
const BS: usize = 4096;
const GATEWAYS: usize = 3;
const OSDS: u32 = 2;
/// Fault kinds, taken in turn.
const KINDS: usize = 6;
const WORKERS: u64 = 6;
const SLOTS: u64 = 64;
/// How long a fault holds before it is healed (a short pause is resumed after this).
const HOLD: Duration = Duration::from_millis(1000);
/// The gateways' watch timeout (`watch-timeout` of their LUN): seconds of silence after
/// which the others may fence one. Shorter than the default 5 s, so that the faults that
/// outlast it take less of the test command's time.
const WATCH_TIMEOUT_S: u64 = 3;
/// A long pause: past the gateways' watch timeout.
const LONG_PAUSE: Duration = Duration::from_secs(WATCH_TIMEOUT_S + 1);
/// Bound for the host's paths to be back after a fault is healed.
const HEAL: Duration = Duration::from_secs(60);
/// COMPARE AND WRITE rounds raced through two gateways after each fault.
const CAW_ROUNDS: u64 = 5;

/// A deterministic byte pattern (the oracle's blocks are made of it).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill(usize),
    Pause(usize),
    LongPause(usize),
    HostCut(usize),
    /// kill -9 of an OSD, restarted after [`HOLD`]: half the image's objects (a size-1 pool)
    /// wait for it on every gateway at once.
    OsdRestart(u32),
    /// A gateway cut off from the cluster (and the other gateways) for [`LONG_PAUSE`]: alive
    /// and reachable by its hosts, but its storage hangs and its watch times out.
    StorageCut(usize),
}

impl Fault {
    /// Kinds in turn; the gateway (or OSD) hit moves on each round of kinds.
    fn nth(i: usize) -> Fault {
        let g = (i / KINDS + i % KINDS) % GATEWAYS;
        match i % KINDS {
            0 => Fault::Kill(g),
            1 => Fault::HostCut(g),
            2 => Fault::Pause(g),
            3 => Fault::LongPause(g),
            4 => Fault::StorageCut(g),
            _ => Fault::OsdRestart((i / KINDS) as u32 % OSDS),
        }
    }

    /// The gateway it hits (an OSD restart: the one the reservation change avoids anyway).
    fn gateway(self, i: usize) -> usize {
        match self {
            Fault::Kill(g)
            | Fault::Pause(g)
            | Fault::LongPause(g)
            | Fault::HostCut(g)
            | Fault::StorageCut(g) => g,
            Fault::OsdRestart(_) => i % GATEWAYS,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Fault::Kill(_) => "kill -9",
            Fault::Pause(_) => "SIGSTOP 1 s",
            Fault::LongPause(_) => "SIGSTOP 4 s (past the watch)",
            Fault::HostCut(_) => "cut from the host",
            Fault::OsdRestart(_) => "OSD kill -9 and restart",
            Fault::StorageCut(_) => "cut from the cluster 4 s",
        }
    }
}

/// One gateway: its portal (kept across restarts) and its process.
struct Gateway {
    port: u16,
    /// The user it runs as (its own, so nftables can cut it off from the cluster alone).
    uid: u32,
    /// A copy of `lanes` that user may run (the build's directory may be closed to it).
    bin: PathBuf,
    config: PathBuf,
    serve: Option<ServeChild>,
    /// The address of its Ceph client (as `ceph osd blocklist` lists it).
    client: String,
}

/// The first gateway's user id (the others follow): ids no account on the machine uses.
const FIRST_UID: u32 = 64_170;

/// [`FIRST_UID`], or `LANES_RBD_FIRST_UID` (`bench/rbd-faults` takes other ids, so that a
/// campaign beside the test command never cuts the other's gateways off).
fn first_uid() -> u32 {
    std::env::var("LANES_RBD_FIRST_UID")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FIRST_UID)
}

/// The gateway's own copy of the cluster's configuration, with the admin key beside it and
/// the client's log and admin socket in its home (it runs as a user of its own, which cannot
/// read the cluster's directory).
fn own_ceph_conf(cluster: &Cluster, home: &Path) -> PathBuf {
    let conf = std::fs::read_to_string(&cluster.conf).expect("the cluster's ceph.conf");
    let key_src = cluster.conf.with_file_name("ceph.client.admin.keyring");
    let key = home.join("ceph.client.admin.keyring");
    std::fs::copy(&key_src, &key).expect("the admin keyring");
    let path = home.join("ceph.conf");
    std::fs::write(
        &path,
        format!(
            "{conf}\n[client]\nkeyring = {}\nlog file = {}\nadmin socket = {}\n",
            key.display(),
            home.join("client.log").display(),
            home.join("client.$pid.asok").display(),
        ),
    )
    .unwrap();
    path
}

/// Hands `dir` and what is in it to `uid`.
fn chown_tree(dir: &Path, uid: u32) {
    let ok = Command::new("chown")
        .args(["-R", &format!("{uid}:{uid}")])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "chown -R {uid} {}", dir.display());
}

/// The clients watching the image's reservation object.
fn watchers(cluster: &Cluster) -> Vec<String> {
    cluster
        .rados(&["-p", "rbd", "listwatchers", "lanes.pr.faults"])
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("watcher="))
        .map(str::to_string)
        .collect()
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().unwrap().port()
}

impl Gateway {
    fn new(cluster: &Cluster, dir: &Path, n: usize, spec: &str) -> Gateway {
        let (pool, image) = spec.split_once('/').unwrap();
        let port = free_port();
        let home = dir.join(format!("gw{n}"));
        std::fs::create_dir_all(&home).unwrap();
        let uid = first_uid() + n as u32;
        let ceph_conf = own_ceph_conf(cluster, &home);
        let config = home.join("lanes.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\ndata-dir = \"{}\"\n\n[[portal-group]]\ntag = {tag}\nportals = [\"127.0.0.1:{port}\"]\n\n\
                 [[target]]\nname = \"{TARGET}\"\n\n[[target.lun]]\nlun = 0\nbackend = \"rbd\"\n\
                 pool = \"{pool}\"\nimage = \"{image}\"\nceph-conf = \"{}\"\nwatch-timeout = {WATCH_TIMEOUT_S}\n",
                home.join("data").display(),
                ceph_conf.display(),
                tag = n + 1,
            ),
        )
        .unwrap();
        std::fs::create_dir_all(home.join("data")).unwrap();
        chown_tree(&home, uid);
        let bin = dir.join("lanes");
        if !bin.exists() {
            std::fs::copy(env!("CARGO_BIN_EXE_lanes"), &bin).expect("a copy of lanes");
        }
        let mut g = Gateway {
            port,
            uid,
            bin,
            config,
            serve: None,
            client: String::new(),
        };
        g.start(cluster);
        g
    }

    /// Starts it and learns its client's address: the watcher that was not there before.
    fn start(&mut self, cluster: &Cluster) {
        let before = watchers(cluster);
        self.serve = Some(
            ServeCommand::new(&self.bin)
                .as_user(self.uid)
                .arg("--config")
                .arg(&self.config)
                .inherit_stderr()
                .start(),
        );
        let new: Vec<String> = watchers(cluster)
            .into_iter()
            .filter(|w| !before.contains(w))
            .collect();
        assert_eq!(new.len(), 1, "one new watcher per gateway start: {new:?}");
        self.client = new[0].clone();
    }

    fn portal(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn serve(&self) -> &ServeChild {
        self.serve.as_ref().expect("running")
    }
}

/// An nftables table of the test's own that black-holes chosen portals, both ways; removed
/// on drop.
struct Blackhole {
    table: String,
}

fn nft(script: &str) {
    let out = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(script.as_bytes())?;
            c.wait_with_output()
        })
        .expect("nft (the nftables package)");
    assert!(
        out.status.success(),
        "nft {script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Blackhole {
    fn new() -> Blackhole {
        let table = format!("lanes_rbdf_{}", std::process::id());
        nft(&format!(
            "table inet {table} {{\n chain out {{ type filter hook output priority 0; }}\n}}\n"
        ));
        Blackhole { table }
    }

    fn cut(&self, port: u16) {
        let t = &self.table;
        nft(&format!(
            "add rule inet {t} out ip daddr 127.0.0.1 tcp dport {port} drop\n\
             add rule inet {t} out ip saddr 127.0.0.1 tcp sport {port} drop\n"
        ));
    }

    /// Everything user `uid` sends to the cluster's address is dropped (a gateway cut off
    /// from the cluster, and so from the other gateways: they meet only through RADOS).
    fn cut_storage(&self, uid: u32, cluster_addr: &str) {
        let t = &self.table;
        nft(&format!(
            "add rule inet {t} out meta skuid {uid} ip daddr {cluster_addr} drop\n"
        ));
    }

    fn restore(&self) {
        nft(&format!("flush chain inet {} out\n", self.table));
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

/// Whether the gateway at `portal` answers TEST UNIT READY with GOOD (after any unit
/// attention), in a session of its own.
async fn serving(portal: &str) -> bool {
    let Ok(addr) = portal.parse() else {
        return false;
    };
    let opts = LoginOptions::new("iqn.2026-11.io.lanes:rbd-faults-checker");
    let bound = Duration::from_secs(4);
    let Ok(Ok(s)) = tokio::time::timeout(bound, Session::login(addr, TARGET, &opts)).await else {
        return false;
    };
    let mut good = false;
    for _ in 0..4 {
        match tokio::time::timeout(bound, s.execute([0; 16], 0, None)).await {
            Ok(Ok(out)) if out.status == 0 => good = true,
            Ok(Ok(out)) if out.sense_triplet().map(|t| t.0) == Some(6) => continue,
            _ => {}
        }
        break;
    }
    let _ = tokio::time::timeout(bound, s.logout()).await;
    good
}

/// REPORT TARGET PORT GROUPS through the gateway at `portal`, in a session of its own:
/// `(group, state)` by group.
async fn port_groups(portal: &str) -> Option<Vec<(u16, u8)>> {
    let addr = portal.parse().ok()?;
    let opts = LoginOptions::new("iqn.2026-11.io.lanes:rbd-faults-checker");
    let bound = Duration::from_secs(4);
    let s = tokio::time::timeout(bound, Session::login(addr, TARGET, &opts))
        .await
        .ok()?
        .ok()?;
    let groups = tokio::time::timeout(bound, s.report_target_port_groups()).await;
    let _ = tokio::time::timeout(bound, s.logout()).await;
    let mut groups: Vec<(u16, u8)> = groups
        .ok()?
        .ok()?
        .iter()
        .map(|g| (g.group, g.state))
        .collect();
    groups.sort_unstable();
    Some(groups)
}

/// Every gateway reports every gateway's port group active/optimized, within `bound` (the
/// gateways share their states once a second).
async fn port_groups_agree(portals: &[String], bound: Duration) -> Result<(), String> {
    let expected: Vec<(u16, u8)> = (1..=GATEWAYS as u16).map(|g| (g, 0)).collect();
    let deadline = Instant::now() + bound;
    loop {
        let mut seen = Vec::new();
        for p in portals {
            seen.push(port_groups(p).await);
        }
        if seen.iter().all(|s| s.as_ref() == Some(&expected)) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "port groups through each gateway {seen:?}, not {expected:?} through every one"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn faults_under_load_lose_no_acknowledged_write() {
    let faults: usize = std::env::var("LANES_RBD_FAULTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let cluster = Cluster::start(OSDS);
    let spec = cluster.image("faults", "64M");
    // The reservation object exists before the first gateway (which would create it), so
    // its watchers can be listed from the start.
    cluster.rados(&["-p", "rbd", "create", "lanes.pr.faults"]);
    let dir = tempfile::tempdir().unwrap();
    // The gateways run as users of their own: they must reach their homes in it.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut gws: Vec<Gateway> = (0..GATEWAYS)
        .map(|n| Gateway::new(&cluster, dir.path(), n, &spec))
        .collect();
    assert!(gws
        .windows(2)
        .all(|w| w[0].serve().wwids == w[1].serve().wwids));
    let holes = Blackhole::new();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let portals: Vec<String> = gws.iter().map(Gateway::portal).collect();
    let mp = rt.block_on(async {
        let paths = portals
            .iter()
            .enumerate()
            .map(|(n, a)| PortalConfig {
                addr: a.parse().unwrap(),
                tpgt: n as u16 + 1,
                weight: 1,
                priority: 0,
                interface: None,
            })
            .collect();
        let cfg = MultipathConfig::new(
            TARGET,
            paths,
            LoginOptions::new("iqn.2026-11.io.lanes:rbd-faults-host"),
        );
        let mp = Arc::new(Multipath::attach(cfg).await.expect("attach"));
        assert!(mp.refused().is_empty(), "refused: {:?}", mp.refused());
        mp
    });
    let all_paths = |mp: &Multipath, what: &str| {
        let start = Instant::now();
        while !mp.status().paths.iter().all(|p| p.eligible) {
            assert!(
                start.elapsed() < HEAL,
                "{what}: paths {:?}",
                mp.status().paths
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        start.elapsed()
    };
    all_paths(&mp, "after attach");
    assert_eq!(mp.status().paths.len(), GATEWAYS);

    let load = Arc::new(Load::new(WORKERS, SLOTS));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| rt.spawn(load.clone().worker(mp.clone(), w)))
        .collect();
    load.progress(500, "load before the first fault");
    let probe_portals = portals
        .iter()
        .enumerate()
        .map(|(n, p)| (p.clone(), n as u16 + 1))
        .collect();
    // A change waits up to the watch timeout for a silent gateway, then fences it.
    let mut probe = PrProbe::new(probe_portals, TARGET).with_change_bound(Duration::from_secs(15));
    // librbd's compare-and-write covers one 512-byte sector: the LUN keeps 512-byte blocks.
    let mut caw = CawProbe::with_block_size(512);
    let mut per_kind: std::collections::BTreeMap<&str, (u32, Duration, Duration)> =
        Default::default();
    let mut reconnected = 0u32;
    let campaign = Instant::now();
    for i in 0..faults {
        let fault = Fault::nth(i);
        let g = fault.gateway(i);
        eprintln!(
            "fault {i} ({fault:?}) begins at {:?}; clients {:?}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
            gws.iter().map(|g| g.client.clone()).collect::<Vec<_>>()
        );
        let spared = (g + 1 + i % 2) % GATEWAYS;
        *load.worst.lock().unwrap() = Duration::ZERO;
        // While the fault holds: a reservation change through a gateway it spares, running
        // beside the hold (it may wait for the faulted gateway; the hold does not wait for it).
        let key = i as u64 + 1;
        let p = std::mem::replace(&mut probe, PrProbe::new(Vec::new(), TARGET));
        let change = |p| {
            let mut p: PrProbe = p;
            rt.spawn(async move {
                p.change(spared, key).await;
                p
            })
        };
        let change = match fault {
            Fault::Kill(g) => {
                gws[g]
                    .serve
                    .as_mut()
                    .unwrap()
                    .stop(Signal::Kill, Duration::from_secs(10))
                    .expect("the gateway exits on SIGKILL");
                gws[g].serve = None;
                let change = change(p);
                // Dead for a second, then started again (as systemd restarts a crashed
                // lanes.service): the new process fences its predecessor's client as it starts.
                std::thread::sleep(HOLD);
                gws[g].start(&cluster);
                load.progress(100, "load after a gateway's restart");
                change
            }
            Fault::Pause(g) | Fault::LongPause(g) => {
                let hold = if matches!(fault, Fault::Pause(_)) {
                    HOLD
                } else {
                    LONG_PAUSE
                };
                gws[g].serve().pause();
                let change = change(p);
                std::thread::sleep(hold);
                gws[g].serve().resume();
                change
            }
            Fault::OsdRestart(osd) => {
                let change = change(p);
                let back = cluster.restart_osd(osd, HOLD);
                eprintln!("fault {i}: osd.{osd} active again {back:?} after its kill");
                change
            }
            Fault::StorageCut(g) => {
                holes.cut_storage(gws[g].uid, &cluster.addr);
                let change = change(p);
                std::thread::sleep(LONG_PAUSE);
                holes.restore();
                change
            }
            Fault::HostCut(g) => {
                holes.cut(gws[g].port);
                let change = change(p);
                std::thread::sleep(HOLD);
                holes.restore();
                change
            }
        };
        probe = rt.block_on(change).expect("the reservation change task");
        // A gateway the cluster fenced comes back by itself with a new client: wait for it
        // to watch the reservation object (then it serves again), and learn its address.
        let heal_start = Instant::now();
        let blocklist = cluster.ceph(&["osd", "blocklist", "ls"]);
        let fenced: Vec<usize> = (0..GATEWAYS)
            .filter(|n| blocklist.contains(gws[*n].client.as_str()))
            .collect();
        for n in fenced {
            reconnected += 1;
            let known: Vec<String> = gws.iter().map(|g| g.client.clone()).collect();
            let new = loop {
                // Not a client of another gateway, nor a fenced one whose watch lingers.
                let now = watchers(&cluster);
                let out = cluster.ceph(&["osd", "blocklist", "ls"]);
                if let Some(w) = now
                    .into_iter()
                    .find(|w| !known.contains(w) && !out.contains(w.as_str()))
                {
                    break w;
                }
                assert!(
                    heal_start.elapsed() < HEAL,
                    "fault {i} ({fault:?}): fenced gateway {n} never reconnected"
                );
                std::thread::sleep(Duration::from_millis(50));
            };
            gws[n].client = new;
            // Watching comes first; the port group returns on the gateway's next check.
            while !rt.block_on(serving(&portals[n])) {
                assert!(
                    heal_start.elapsed() < HEAL,
                    "fault {i} ({fault:?}): gateway {n} reconnected but does not serve"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        all_paths(&mp, &format!("fault {i} ({fault:?})"));
        let heal = heal_start.elapsed();
        let agreed = rt.block_on(port_groups_agree(&portals, Duration::from_secs(10)));
        let mut p = std::mem::replace(&mut probe, PrProbe::new(Vec::new(), TARGET));
        let (p, checked) = rt.block_on(async move {
            let r = p.check().await;
            (p, r)
        });
        probe = p;
        let (a, b) = (&portals[i % GATEWAYS], &portals[(i + 1) % GATEWAYS]);
        let raced = rt.block_on(caw.race_between(a, b, TARGET, CAW_ROUNDS));
        for why in [checked.err(), raced.err(), agreed.err()]
            .into_iter()
            .flatten()
        {
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
        println!(
            "fault {i} {:28} gateway {g}: longest request {worst:?}, heal {heal:?}",
            fault.name()
        );
    }
    load.stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for w in workers {
            w.await.unwrap();
        }
    });
    println!(
        "campaign: {faults} faults in {:?}, {} requests, 0 errors, 0 violations; \
         {} reservation changes ({} not answered GOOD), registrations and port group states \
         identical on every gateway after every fault; {} COMPARE AND WRITE rounds, at most one \
         landing each ({} with an answer NOT READY, its outcome read back); \
         {reconnected} fenced gateways reconnected by themselves",
        campaign.elapsed(),
        load.done.load(Ordering::Relaxed),
        probe.changes,
        probe.unanswered,
        caw.rounds,
        caw.unknown,
    );
    for (kind, (n, worst, heal)) in &per_kind {
        println!("  {kind:30} {n:4} faults, longest request {worst:?}, longest heal {heal:?}");
    }
    // Every block as last acknowledged, read through the host's device.
    let slots = load.slots.lock().unwrap().clone();
    let bad = rt.block_on(async move {
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
    assert!(bad.is_empty(), "final read-back: {bad:?}");
}
