//! An HA pair in the lab: `lanes serve` on node1 and node2 from one configuration file (only
//! `--node` differs), replicating one LUN over the lab's peer link, etcd in the witness
//! namespace. From the host namespace, iSCSI sessions to both nodes: a write on node1 reads
//! back on node2; kill -9 of node1, and writes through node2 go on after the epoch race (the
//! gap is measured); node1 restarted is resynced, and both backing files end identical.
//!
//! Needs root, ip, tc and etcd (fails, not skips, without them). Traffic stays inside the
//! lab's namespaces.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::os::fd::AsFd as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use lanes_initiator::{LoginOptions, Session};
use lanes_test_support::require_root;
use lanes_test_support::serve::{ServeChild, ServeCommand, Signal};

const TARGET: &str = "iqn.2026-11.io.lanes:pair";
const BS: usize = 4096;

struct Rig {
    lab: String,
    dir: tempfile::TempDir,
    serves: [Option<ServeChild>; 2],
    host: Option<tokio::runtime::Runtime>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.serves = [None, None];
        if let Some(rt) = self.host.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
        let _ = lanes_lab::down(&self.lab);
    }
}

fn config(etcd: [SocketAddr; 2]) -> String {
    format!(
        r#"[server]
data-dir = "data"
nop-interval = "30s"
nop-timeout = "120s"

[cluster]
preferred = 1
name = "lab-pair"
etcd = ["{e1}", "{e2}"]
listen = "10.78.1.1:7000"
peer = "10.78.1.2:7000"
heartbeat = "100ms"

[[portal-group]]
tag = 1
node = 1
portals = ["10.77.1.2:3260"]

[[portal-group]]
tag = 2
node = 1
portals = ["10.77.2.2:3260"]

[[portal-group]]
tag = 3
node = 2
portals = ["10.77.1.3:3260"]

[[portal-group]]
tag = 4
node = 2
portals = ["10.77.2.3:3260"]

[[target]]
name = "{TARGET}"

[[target.lun]]
lun = 0
path = "disk0.img"
size = "64M"
block-size = 4096
"#,
        e1 = etcd[0],
        e2 = etcd[1],
    )
}

impl Rig {
    fn node_dir(&self, node: usize) -> PathBuf {
        self.dir.path().join(format!("node{node}"))
    }

    fn start(&mut self, node: usize) {
        let dir = self.node_dir(node);
        let serve = ServeCommand::new(env!("CARGO_BIN_EXE_lanes"))
            .in_namespace(&lanes_lab::plan::real_namespace(
                &self.lab,
                &format!("node{node}"),
            ))
            .arg("--config")
            .arg(dir.join("lanes.toml"))
            .args(["--node", &node.to_string()])
            .log_level("warn,lanes_ha=info")
            .inherit_stderr()
            .start();
        self.serves[node - 1] = Some(serve);
    }

    fn status(&self, node: usize) -> serde_json::Value {
        let socket = self.node_dir(node).join("data").join("lanes.sock");
        let mut s = UnixStream::connect(&socket).expect("status socket");
        s.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).expect("JSON")
    }

    /// Poll node's status (bounded) until the LUN's pair role is `role`.
    fn wait_role(&self, node: usize, role: &str, within: Duration) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            let s = self.status(node);
            if s["pairs"][0]["role"] == role {
                return s;
            }
            assert!(Instant::now() < deadline, "node{node} never {role}: {s}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `f` on the host runtime (its threads live in the lab's host namespace, so every
    /// socket the initiator opens is the host's; sessions outlive one call).
    fn in_host<T: Send + 'static>(
        &mut self,
        f: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        if self.host.is_none() {
            let path = format!(
                "/run/netns/{}",
                lanes_lab::plan::real_namespace(&self.lab, "host")
            );
            let rt = std::thread::spawn(move || {
                let ns = std::fs::File::open(&path).expect("host namespace");
                rustix::thread::move_into_link_name_space(
                    ns.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .expect("setns host");
                // Worker threads start here and inherit the host namespace.
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("runtime")
            })
            .join()
            .expect("host thread");
            self.host = Some(rt);
        }
        let rt = self.host.as_ref().expect("host runtime");
        let task = rt.spawn(f);
        rt.block_on(task).expect("host task")
    }
}

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

async fn login(portal: &str) -> Session {
    let portal: SocketAddr = portal.parse().unwrap();
    let s = Session::login(
        portal,
        TARGET,
        &LoginOptions::new("iqn.2026-11.io.lanes:lab-host"),
    )
    .await
    .unwrap_or_else(|e| panic!("login {portal}: {e}"));
    let (blocks, bs) = s.read_capacity16().await.unwrap();
    assert_eq!((blocks, bs as usize), (64 << 20 >> 12, BS));
    s
}

fn crc_of(path: &Path) -> u32 {
    crc32c::crc32c(&std::fs::read(path).unwrap())
}

#[test]
fn a_pair_survives_kill_9_of_a_node_and_resyncs_it() {
    require_root();
    let lab = format!("h{}-ha", std::process::id());
    let _ = lanes_lab::down(&lab);
    let options = lanes_lab::Options {
        name: lab.clone(),
        topology: lanes_lab::Topology::Pathing,
        nics: 2,
        storage_nics: 2,
        rate: "1gbit".parse().unwrap(),
        storage_nodes: 2,
        mtu: 1500,
        pair: lanes_lab::Pair {
            peer_nics: 1,
            peer_rate: None,
            witness: true,
        },
    };
    let state = lanes_lab::up(&options, &AtomicBool::new(false)).expect("lab up");
    let etcd = [1, 2].map(|k| SocketAddr::from(state.plan.witness_endpoint(k).unwrap()));
    let mut rig = Rig {
        lab,
        dir: tempfile::tempdir().unwrap(),
        serves: [None, None],
        host: None,
    };
    // One configuration text for both nodes (each in its own directory: the LUN's relative
    // path then names each node's own backing file).
    for node in [1, 2] {
        std::fs::create_dir_all(rig.node_dir(node)).unwrap();
        std::fs::write(rig.node_dir(node).join("lanes.toml"), config(etcd)).unwrap();
    }
    rig.start(1);
    rig.start(2);
    rig.wait_role(1, "Paired", Duration::from_secs(20));
    rig.wait_role(2, "Paired", Duration::from_secs(20));
    let (w1, w2) = (
        rig.serves[0].as_ref().unwrap().wwid().to_string(),
        rig.serves[1].as_ref().unwrap().wwid().to_string(),
    );
    assert_eq!(w1, w2, "both nodes report one WWID");

    // Sessions from the host to both nodes: one disk, written on node1, read on node2.
    let first = pattern(1, 256 * BS);
    let (s1, s2) = rig.in_host({
        let first = first.clone();
        async move {
            let s1 = login("10.77.1.2:3260").await;
            let s2 = login("10.77.2.3:3260").await;
            // The first designator is the NAA identifier (the others name each port).
            let naa = |page: bytes::Bytes| page[4..8 + usize::from(page[7])].to_vec();
            let (n1, n2) = (
                naa(s1.inquiry(Some(0x83)).await.unwrap()),
                naa(s2.inquiry(Some(0x83)).await.unwrap()),
            );
            assert_eq!(n1[1] & 0x0f, 3, "an NAA designator");
            assert_eq!(n1, n2, "one NAA identifier on both nodes");
            s1.write(0, &first).await.unwrap();
            let back = s2.read(0, 256).await.unwrap();
            assert!(back[..] == first[..], "node2 reads what node1 wrote");
            (s1, s2)
        }
    });
    drop(s1);

    // kill -9 node1: writes through node2 must go on once node2 won the epoch.
    let killed = Instant::now();
    rig.serves[0]
        .as_mut()
        .unwrap()
        .stop(Signal::Kill, Duration::from_secs(10))
        .expect("node1 exits");
    rig.serves[0] = None;
    let (gap, s2) = rig.in_host(async move {
        let data = pattern(2, BS);
        s2.write(1000, &data)
            .await
            .expect("first write after the kill");
        let gap = killed.elapsed();
        // Writing alone: 2000 random 4 KiB blocks.
        for i in 0..2000u64 {
            let lba = 4096 + (i * 7919) % 12000;
            s2.write(lba, &pattern(100 + i, BS)).await.unwrap();
        }
        s2.synchronize_cache().await.unwrap();
        (gap, s2)
    });
    let alone = rig.wait_role(2, "Alone", Duration::from_secs(1));
    println!(
        "failover: first write through node2 acknowledged {gap:?} after kill -9 of node1 (epoch {})",
        alone["pairs"][0]["epoch"]
    );
    assert!(gap < Duration::from_secs(3), "failover gap {gap:?}");
    let dirty = alone["pairs"][0]["dirty_regions"].as_u64().unwrap();

    // node1 returns on its files: resynced from node2, then paired.
    let resync_before = alone["pairs"][0]["resync_blocks"].as_u64().unwrap();
    let restarted = Instant::now();
    rig.start(1);
    rig.wait_role(1, "Paired", Duration::from_secs(60));
    let after = rig.wait_role(2, "Paired", Duration::from_secs(60));
    let resync = after["pairs"][0]["resync_blocks"].as_u64().unwrap() - resync_before;
    println!(
        "resync: {resync} blocks of 4 KiB copied in {:?} for 2001 writes alone ({dirty} regions dirty)",
        restarted.elapsed()
    );
    assert!(resync >= dirty, "resync {resync} < dirty {dirty}");
    rig.in_host(async move {
        s2.synchronize_cache().await.unwrap();
        let s1 = login("10.77.2.2:3260").await;
        let back = s1.read(1000, 1).await.unwrap();
        assert!(
            back[..] == pattern(2, BS)[..],
            "node1 has the write made while it was down"
        );
    });
    let files = [1, 2].map(|n| rig.node_dir(n).join("disk0.img"));
    let (c1, c2) = (crc_of(&files[0]), crc_of(&files[1]));
    println!("checksums: node1 {c1:08x} node2 {c2:08x}");
    assert_eq!(c1, c2, "backing files differ after resync");
}
