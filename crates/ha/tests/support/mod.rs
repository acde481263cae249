//! Two replicated LUNs in one process, on real sockets on 127.0.0.1, a real etcd, file-backed
//! local disks: the harness shared by the pair tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use blockstore::{BlockDevice, FileDevice};
use lanes_ha::{PairConfig, PairStatus, ReplicatedLun};
use lanes_test_support::etcd::Etcd;
use lanes_witness::WitnessConfig;
use replication::Alua;

pub const BS: u64 = 4096;
pub const BLOCKS: u64 = 2048; // 8 MiB

pub struct Node {
    pub lun: Arc<ReplicatedLun>,
    pub dev: Arc<dyn BlockDevice>,
}

pub struct Pair {
    pub etcd: Etcd,
    pub _dir: tempfile::TempDir,
    pub dir: PathBuf,
    pub listen: [SocketAddr; 2],
    pub disks: [Arc<dyn BlockDevice>; 2],
}

impl Pair {
    pub fn new() -> Pair {
        Pair::wrapping(|_, d| d)
    }

    /// A pair whose local disks are `wrap(node, file disk)`.
    pub fn wrapping(wrap: impl Fn(usize, Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice>) -> Pair {
        // RUST_LOG=lanes_ha=debug shows both nodes' logs beside a failure.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let etcd = Etcd::start();
        let dir = tempfile::tempdir().unwrap();
        let disk = |n: usize| -> Arc<dyn BlockDevice> {
            wrap(
                n,
                Arc::new(
                    FileDevice::open(dir.path().join(format!("disk{n}")), Some(BLOCKS * BS))
                        .unwrap(),
                ),
            )
        };
        Pair {
            disks: [disk(0), disk(1)],
            dir: dir.path().to_path_buf(),
            _dir: dir,
            etcd,
            listen: lanes_test_support::ports::free_addrs(),
        }
    }

    pub fn config(&self, node: u8) -> PairConfig {
        PairConfig {
            node,
            preferred: 0,
            listen: self.listen[usize::from(node)],
            peer: self.listen[usize::from(1 - node)],
            witness: WitnessConfig {
                endpoints: vec![self.etcd.client],
                key: "/lanes/test/lun0/epoch".into(),
                node,
                timeout: Duration::from_millis(500),
            },
            meta_path: self.dir.join(format!("meta{node}")),
            replacement: false,
            core: replication::Config::new(node, 0, BLOCKS),
            shared: Default::default(),
            inline_slow: lanes_ha::INLINE_SLOW,
        }
    }

    pub fn start(&self, node: u8) -> Node {
        self.start_with(node, |_| {})
    }

    /// Start `node` with its configuration changed by `change`.
    pub fn start_with(&self, node: u8, change: impl FnOnce(&mut PairConfig)) -> Node {
        let mut cfg = self.config(node);
        change(&mut cfg);
        let lun = ReplicatedLun::start(cfg, self.disks[usize::from(node)].clone()).unwrap();
        Node {
            dev: lun.device(),
            lun,
        }
    }

    /// Both local disks, byte for byte.
    pub fn local_images(&self) -> [Vec<u8>; 2] {
        self.disks.clone().map(|d| image(&*d))
    }
}

pub fn image(d: &dyn BlockDevice) -> Vec<u8> {
    let mut v = vec![0u8; (BLOCKS * BS) as usize];
    d.read_at(&mut v, 0).unwrap();
    v
}

pub fn checksum(v: &[u8]) -> u32 {
    crc32c::crc32c(v)
}

/// Wait (bounded) until the status satisfies `f`.
pub async fn wait_status(n: &Node, what: &str, f: impl Fn(&PairStatus) -> bool) -> PairStatus {
    let mut w = n.lun.status_watch();
    let r = tokio::time::timeout(Duration::from_secs(15), w.wait_for(|s| f(s))).await;
    match r {
        Ok(Ok(s)) => *s,
        _ => panic!("{what}: status stayed {:?}", n.lun.status()),
    }
}

pub async fn paired(nodes: [&Node; 2]) {
    for n in nodes {
        wait_status(n, "pairing", |s| {
            s.state == "Paired" && s.peer_connected && s.alua == Alua::ActiveOptimized
        })
        .await;
    }
}

/// Deterministic test data for a write.
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

pub async fn write(dev: &Arc<dyn BlockDevice>, lba: u64, data: Vec<u8>) -> std::io::Result<()> {
    let dev = dev.clone();
    tokio::task::spawn_blocking(move || dev.write_at(&data, lba * BS))
        .await
        .unwrap()
}

pub async fn read(dev: &Arc<dyn BlockDevice>, lba: u64, blocks: u64) -> std::io::Result<Vec<u8>> {
    let dev = dev.clone();
    tokio::task::spawn_blocking(move || {
        let mut v = vec![0u8; (blocks * BS) as usize];
        dev.read_at(&mut v, lba * BS).map(|()| v)
    })
    .await
    .unwrap()
}

pub async fn flush(dev: &Arc<dyn BlockDevice>) -> std::io::Result<()> {
    let dev = dev.clone();
    tokio::task::spawn_blocking(move || dev.flush())
        .await
        .unwrap()
}
