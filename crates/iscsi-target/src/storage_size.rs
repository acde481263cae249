//! LUNs whose size a tool outside lanes can change (an RBD image after `rbd resize`, on any
//! gateway or none): every [`PERIOD`] each such LUN asks its storage for its size and grows to
//! it, with CAPACITY DATA HAS CHANGED for every I_T nexus, so hosts re-read the capacity
//! (Linux: "capacity data has changed" and the new size in the kernel log) without a reload.

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
