//! `[cluster]` at run time: each LUN's device wrapped in a replicated LUN (`lanes-ha`), and
//! the target's port groups following the pair.
//!
//! A node's own port groups take the replica's ALUA state (the worst over the target's LUNs:
//! one set of port groups serves them all). The peer's groups, which this node only reports
//! in REPORT TARGET PORT GROUPS, are what this node knows of the peer: active/optimized when
//! paired or when the peer is the one serving (this node outdated or being resynced),
//! transitioning while this node resyncs it, unavailable otherwise (this node alone or
//! suspended).

use std::sync::Arc;
use std::time::Duration;

use lanes_ha::{PairConfig, PairStatus, ReplicatedLun};
use replication::Alua;

use crate::config::{ClusterConfig, LunConfig};

/// The metadata journal of a replicated LUN: next to its backing file.
pub fn meta_path(lun: &LunConfig) -> std::path::PathBuf {
    let mut p = lun.path.clone().into_os_string();
    p.push(".ha-meta");
    p.into()
}

/// The replication settings of `lun` on this node.
pub fn pair_config(cluster: &ClusterConfig, lun: &LunConfig, size: u64) -> PairConfig {
    let node = cluster.node.saturating_sub(1);
    let bs = lun.block_size;
    let mut core = replication::Config::new(
        node,
        cluster.preferred.saturating_sub(1),
        size / u64::from(bs),
    );
    core.block_size = bs;
    // 4 KiB dirty regions and 4 MiB activity-log extents whatever the block size.
    core.region_blocks = (4096 / bs).max(1);
    core.al_extent_blocks = u64::from((4 << 20) / bs);
    core.al_slots = cluster.activity_log_extents;
    let hb = cluster.heartbeat.as_nanos() as u64;
    core.heartbeat_interval = hb;
    core.read_lease = 2 * hb;
    core.tie_delay = hb;
    core.race_retry = hb;
    PairConfig {
        node,
        preferred: core.preferred,
        listen: cluster.listen(lun.lun),
        peer: cluster.peer(lun.lun),
        witness: lanes_witness::WitnessConfig {
            endpoints: cluster.etcd.clone(),
            key: cluster.epoch_key(lun.lun),
            node,
            timeout: Duration::from_secs(1),
        },
        meta_path: meta_path(lun),
        replacement: cluster.replacement,
        core,
        shared: crate::pair_pr::load_state(&crate::pair_pr::state_path(&lun.path)),
        inline_slow: lanes_ha::INLINE_SLOW,
    }
}

fn own_state(a: Alua) -> scsi::AluaState {
    match a {
        Alua::ActiveOptimized => scsi::AluaState::ActiveOptimized,
        Alua::Transitioning => scsi::AluaState::Transitioning,
        Alua::Unavailable => scsi::AluaState::Unavailable,
    }
}

fn peer_state(s: &PairStatus) -> scsi::AluaState {
    match s.state {
        "Paired" | "Outdated" | "ResyncTarget" => scsi::AluaState::ActiveOptimized,
        "ResyncSource" => scsi::AluaState::Transitioning,
        _ => scsi::AluaState::Unavailable,
    }
}

fn rank(s: scsi::AluaState) -> u8 {
    match s {
        scsi::AluaState::ActiveOptimized => 0,
        scsi::AluaState::ActiveNonOptimized => 1,
        scsi::AluaState::Transitioning => 2,
        scsi::AluaState::Standby => 3,
        scsi::AluaState::Unavailable => 4,
    }
}

fn worst(states: impl Iterator<Item = scsi::AluaState>) -> scsi::AluaState {
    states
        .max_by_key(|s| rank(*s))
        .unwrap_or(scsi::AluaState::ActiveOptimized)
}

/// Keep the target's port groups in step with its replicated LUNs (until they stop).
pub fn follow_alua(
    pairs: Vec<Arc<ReplicatedLun>>,
    tpgs: Arc<scsi::TargetPortGroups>,
    own: Vec<u16>,
    peer: Vec<u16>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut watches: Vec<_> = pairs.iter().map(|p| p.status_watch()).collect();
        drop(pairs);
        loop {
            let statuses: Vec<PairStatus> = watches.iter().map(|w| *w.borrow()).collect();
            let mine = worst(statuses.iter().map(|s| own_state(s.alua)));
            let theirs = worst(statuses.iter().map(peer_state));
            for &g in &own {
                tpgs.set_state(g, mine);
            }
            for &g in &peer {
                tpgs.set_state(g, theirs);
            }
            let changed = futures_any(&mut watches).await;
            if !changed {
                return;
            }
        }
    })
}

/// Wait until any watch changes; false once every sender is gone.
async fn futures_any(watches: &mut [tokio::sync::watch::Receiver<PairStatus>]) -> bool {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bool>(1);
    let mut tasks = Vec::new();
    for w in watches.iter() {
        let (mut w, tx) = (w.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let _ = tx.send(w.changed().await.is_ok()).await;
        }));
    }
    drop(tx);
    let mut alive = false;
    while let Some(ok) = rx.recv().await {
        if ok {
            alive = true;
            break;
        }
    }
    for t in tasks {
        t.abort();
    }
    for w in watches.iter_mut() {
        w.borrow_and_update();
    }
    alive
}

/// Start the replicated LUN over `device`.
pub fn start(
    cluster: &ClusterConfig,
    lun: &LunConfig,
    device: Arc<dyn blockstore::BlockDevice>,
) -> Result<Arc<ReplicatedLun>, lanes_ha::Error> {
    let cfg = pair_config(cluster, lun, device.size_bytes());
    ReplicatedLun::start(cfg, device)
}
