//! The HA pair lab rig shared by the pair tests: a lab with two storage nodes, a peer link
//! and a witness, `lanes serve` on both nodes from one configuration text, a host runtime.
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::os::fd::AsFd as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use lanes_initiator::{LoginOptions, Session};
use lanes_test_support::require_root;
use lanes_test_support::serve::{ServeChild, ServeCommand};

pub const TARGET: &str = "iqn.2026-11.io.lanes:pair";
pub const BS: usize = 4096;

pub struct Rig {
    pub lab: String,
    pub dir: tempfile::TempDir,
    pub serves: [Option<ServeChild>; 2],
    pub host: Option<tokio::runtime::Runtime>,
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

pub fn config(etcd: [SocketAddr; 2]) -> String {
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
    pub fn node_dir(&self, node: usize) -> PathBuf {
        self.dir.path().join(format!("node{node}"))
    }

    pub fn start(&mut self, node: usize) {
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

    pub fn status(&self, node: usize) -> serde_json::Value {
        let socket = self.node_dir(node).join("data").join("lanes.sock");
        let mut s = UnixStream::connect(&socket).expect("status socket");
        s.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).expect("JSON")
    }

    /// Poll node's status (bounded) until the LUN's pair role is `role`.
    pub fn wait_role(&self, node: usize, role: &str, within: Duration) -> serde_json::Value {
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
    pub fn in_host<T: Send + 'static>(
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

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
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

pub async fn login(portal: &str) -> Session {
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

/// `lanes attach`'s multipath device over the pair's four paths (two per node), every path
/// eligible.
pub fn attach_four_paths(rig: &mut Rig) -> std::sync::Arc<lanes_initiator::Multipath> {
    use lanes_initiator::multipath::{MultipathConfig, PortalConfig};
    rig.in_host(async move {
        let portals = [
            ("10.77.1.2:3260", 1),
            ("10.77.2.2:3260", 2),
            ("10.77.1.3:3260", 3),
            ("10.77.2.3:3260", 4),
        ]
        .iter()
        .map(|(a, t)| PortalConfig {
            addr: a.parse().unwrap(),
            tpgt: *t,
            weight: 1,
            priority: 0,
            interface: None,
        })
        .collect();
        let cfg = MultipathConfig::new(
            TARGET,
            portals,
            LoginOptions::new("iqn.2026-11.io.lanes:lab-host"),
        );
        let mp = std::sync::Arc::new(
            lanes_initiator::Multipath::attach(cfg)
                .await
                .expect("attach"),
        );
        assert!(mp.refused().is_empty(), "refused: {:?}", mp.refused());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !mp.status().paths.iter().all(|p| p.eligible) {
            assert!(Instant::now() < deadline, "paths: {:?}", mp.status().paths);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(mp.status().paths.len(), 4);
        mp
    })
}

pub fn crc_of(path: &Path) -> u32 {
    crc32c::crc32c(&std::fs::read(path).unwrap())
}

/// A lab with two storage nodes, a peer link and a witness; `lanes serve` on both nodes from
/// one configuration text, paired.
pub fn pair_rig(tag: &str) -> Rig {
    pair_rig_with(tag, "")
}

/// [`pair_rig`] with `lun_lines` appended to the LUN's section of the configuration (e.g.
/// `volatile-cache = true`: kill -9 then loses what a power loss would).
pub fn pair_rig_with(tag: &str, lun_lines: &str) -> Rig {
    require_root();
    let lab = format!("h{}-{tag}", std::process::id());
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
        let text = config(etcd) + lun_lines;
        std::fs::write(rig.node_dir(node).join("lanes.toml"), text).unwrap();
    }
    rig.start(1);
    rig.start(2);
    rig.wait_role(1, "Paired", Duration::from_secs(20));
    rig.wait_role(2, "Paired", Duration::from_secs(20));
    rig
}
