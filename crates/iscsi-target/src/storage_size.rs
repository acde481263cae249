//! What storage outside lanes decides, followed every [`PERIOD`]:
//! - LUNs whose size a tool outside lanes can change (an RBD image after `rbd resize`, on any
//!   gateway or none) ask their storage for its size and grow to it, with CAPACITY DATA HAS
//!   CHANGED for every I_T nexus, so hosts re-read the capacity without a reload;
//! - a target with a LUN whose storage has fenced this server (an RBD gateway whose client the
//!   cluster blocklisted) puts its port groups here in the unavailable state, so TEST UNIT
//!   READY and REPORT TARGET PORT GROUPS agree with the I/O that already fails with NOT READY
//!   (02/04/0C), and hosts keep to other paths (ASYMMETRIC ACCESS STATE CHANGED tells them).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::server::Server;

/// How often a LUN of such storage compares its size with the storage's.
pub const PERIOD: Duration = Duration::from_secs(2);

pub async fn follow_loop(server: Arc<Server>) {
    let mut ticker = tokio::time::interval(PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The last error of each LUN, logged when it first appears or changes.
    let mut errors: HashMap<(String, u64), String> = HashMap::new();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = server.shutdown.cancelled() => return,
        }
        for t in &server.targets {
            fence_if_refused(&server, t);
            for (lun, lu) in t.luns.load().luns() {
                let (lun, lu) = (*lun, lu.clone());
                let before = lu.block_count();
                // The storage may be asked over the network: not on the runtime's threads.
                let followed = tokio::task::spawn_blocking(move || lu.follow_storage_size()).await;
                let key = (t.name.clone(), lun);
                match followed {
                    Ok(Ok(Some(true))) => {
                        errors.remove(&key);
                        info!(target = %t.name, lun, blocks_before = before,
                            "the storage grew: capacity changed, hosts are told");
                    }
                    Ok(Ok(_)) => {
                        errors.remove(&key);
                    }
                    Ok(Err(e)) => {
                        let text = e.to_string();
                        if errors.get(&key) != Some(&text) {
                            warn!(target = %t.name, lun, "following the storage's size: {text}");
                            errors.insert(key, text);
                        }
                    }
                    Err(e) => warn!(target = %t.name, lun, "size check task: {e}"),
                }
            }
        }
    }
}

/// Puts the target's port groups on this server in the unavailable state when the storage of
/// one of its LUNs has fenced this server (once; a restart reconnects).
fn fence_if_refused(server: &Server, t: &crate::TargetRuntime) {
    let fenced = t
        .luns
        .load()
        .luns()
        .iter()
        .any(|(_, lu)| lu.config().device.fenced());
    if !fenced {
        return;
    }
    let tags: std::collections::BTreeSet<u16> = server
        .portals
        .read()
        .iter()
        .map(|p| p.tpgt)
        .filter(|tag| t.on_portal_group(*tag))
        .collect();
    for tag in tags {
        if t.tpgs.state_of(tag) != scsi::AluaState::Unavailable {
            t.tpgs.set_state(tag, scsi::AluaState::Unavailable);
            tracing::error!(target = %t.name, group = tag,
                "the storage has fenced this server: port group unavailable until a restart");
        }
    }
}
