//! What storage outside lanes decides, followed every [`PERIOD`]:
//! - LUNs whose size a tool outside lanes can change (an RBD image after `rbd resize`, on any
//!   gateway or none) ask their storage for its size and grow to it, with CAPACITY DATA HAS
//!   CHANGED for every I_T nexus, so hosts re-read the capacity without a reload;
//! - a target with a LUN whose storage has fenced this server (an RBD gateway whose client the
//!   cluster blocklisted) puts its port groups here in the unavailable state, so TEST UNIT
//!   READY and REPORT TARGET PORT GROUPS agree with the I/O that already fails with NOT READY
//!   (02/04/0C), and hosts keep to other paths (ASYMMETRIC ACCESS STATE CHANGED tells them);
//!   each period such a LUN tries a new connection (a new Ceph client), and once every LUN of
//!   the target serves again its port groups return to the states they had;
//! - a target whose LUNs other servers export too (the gateways of shared RBD images) publishes
//!   its port groups' states through that storage and takes the other servers' groups, so
//!   REPORT TARGET PORT GROUPS gives the same states through every path (a fenced or stopped
//!   gateway's groups unavailable everywhere).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::server::Server;

/// How often a LUN of such storage compares its size with the storage's.
pub const PERIOD: Duration = Duration::from_secs(1);

pub async fn follow_loop(server: Arc<Server>) {
    let mut ticker = tokio::time::interval(PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The last error of each LUN, logged when it first appears or changes.
    let mut errors: HashMap<(String, u64), String> = HashMap::new();
    // The last reconnect error of each fenced LUN, logged the same way.
    let mut reconnect_errors: HashMap<(String, u64), String> = HashMap::new();
    // Port groups this loop made unavailable, with the state each had before.
    let mut fenced: HashMap<(String, u16), scsi::AluaState> = HashMap::new();
    // The last error sharing each target's port groups, logged the same way.
    let mut share_errors: HashMap<String, String> = HashMap::new();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = server.shutdown.cancelled() => return,
        }
        for t in &server.targets {
            // Fencing first: the port groups are unavailable for at least one period (the
            // hosts are told, and move) before a new client may bring them back.
            // A target fenced in this very period waits for the next one to reconnect.
            if !follow_fencing(&server, t, &mut fenced) {
                reconnect_fenced(t, &mut reconnect_errors).await;
            }
            share_port_groups(&server, t, &mut share_errors).await;
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

/// Each LUN of `t` whose storage fenced this server tries once to reconnect (a blocking
/// call, off the runtime's threads); failures are logged when they first appear or change.
async fn reconnect_fenced(t: &crate::TargetRuntime, errors: &mut HashMap<(String, u64), String>) {
    for (lun, lu) in t.luns.load().luns() {
        if !lu.config().device.fenced() {
            continue;
        }
        let device = lu.config().device.clone();
        let key = (t.name.clone(), *lun);
        match tokio::task::spawn_blocking(move || device.reconnect()).await {
            Ok(Ok(true)) => {
                errors.remove(&key);
                info!(target = %t.name, lun, "the storage takes this server again (reconnected)");
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                let text = e.to_string();
                if errors.get(&key) != Some(&text) {
                    warn!(target = %t.name, lun, "reconnecting to the storage: {text}");
                    errors.insert(key, text);
                }
            }
            Err(e) => warn!(target = %t.name, lun, "reconnect task: {e}"),
        }
    }
}

/// Publishes the states of the target's port groups on this server through each LUN whose
/// storage other servers export too, and takes the groups they publish as the target's remote
/// groups (when at least one LUN could tell).
async fn share_port_groups(
    server: &Server,
    t: &crate::TargetRuntime,
    errors: &mut HashMap<String, String>,
) {
    let mine: Vec<(u16, u8)> = local_tags(server, t)
        .into_iter()
        .map(|tag| (tag, t.tpgs.state_of(tag) as u8))
        .collect();
    let mine = Arc::new(mine);
    let mut published = false;
    let mut remote = Vec::new();
    let mut error = None;
    for (lun, lu) in t.luns.load().luns() {
        if lu.config().device.fenced() {
            // It cannot publish; whoever fenced it unpublished it.
            continue;
        }
        let (device, mine) = (lu.config().device.clone(), mine.clone());
        match tokio::task::spawn_blocking(move || device.share_port_groups(&mine)).await {
            Ok(None) => {}
            Ok(Some(Ok(groups))) => {
                published = true;
                remote.extend(
                    groups
                        .into_iter()
                        .filter_map(|(g, code)| Some((g, scsi::AluaState::from_code(code)?))),
                );
            }
            Ok(Some(Err(e))) => error = Some(format!("LUN {lun}: {e}")),
            Err(e) => error = Some(format!("LUN {lun}: task: {e}")),
        }
    }
    match error {
        Some(text) if errors.get(&t.name) != Some(&text) => {
            warn!(target = %t.name, "sharing port group states with the other gateways: {text}");
            errors.insert(t.name.clone(), text);
        }
        Some(_) => {}
        None => {
            errors.remove(&t.name);
        }
    }
    if !published {
        return;
    }
    // Another gateway with one of this gateway's tags: its group cannot be told apart from
    // ours (nor its nexuses, for reservations). Said once while it lasts.
    let mut clash: Vec<u16> = remote
        .iter()
        .map(|(g, _)| *g)
        .filter(|g| mine.iter().any(|(m, _)| m == g))
        .collect();
    clash.sort_unstable();
    clash.dedup();
    let key = format!("{} (tags)", t.name);
    if clash.is_empty() {
        errors.remove(&key);
    } else {
        let text = format!("{clash:?}");
        if errors.get(&key) != Some(&text) {
            warn!(target = %t.name, groups = %text,
                "another gateway of this storage uses this gateway's portal group tag: give each \
                 gateway a [[portal-group]] tag of its own (REPORT TARGET PORT GROUPS and \
                 reservations across gateways tell gateways apart by it)");
            errors.insert(key, text);
        }
    }
    let before = t.tpgs.remote();
    if t.tpgs.set_remote(&remote) {
        info!(target = %t.name, groups = ?t.tpgs.remote(),
            "other gateways' port group states changed: hosts are told");
    } else if t.tpgs.remote() != before {
        info!(target = %t.name, groups = ?t.tpgs.remote(), "other gateways' port groups");
    }
}

/// The tags of this server's portal groups that carry target `t`.
fn local_tags(server: &Server, t: &crate::TargetRuntime) -> std::collections::BTreeSet<u16> {
    server
        .portals
        .read()
        .iter()
        .map(|p| p.tpgt)
        .filter(|tag| t.on_portal_group(*tag))
        .collect()
}

/// Puts the target's port groups on this server in the unavailable state while the storage of
/// one of its LUNs has fenced this server, and back to their earlier states (recorded in
/// `fenced`) once none is fenced any more. True when it made a group unavailable just now.
fn follow_fencing(
    server: &Server,
    t: &crate::TargetRuntime,
    fenced: &mut HashMap<(String, u16), scsi::AluaState>,
) -> bool {
    let mut newly = false;
    let refused = t
        .luns
        .load()
        .luns()
        .iter()
        .any(|(_, lu)| lu.config().device.fenced());
    for tag in local_tags(server, t) {
        let key = (t.name.clone(), tag);
        if refused {
            let now = t.tpgs.state_of(tag);
            if now != scsi::AluaState::Unavailable {
                fenced.entry(key).or_insert(now);
                t.tpgs.set_state(tag, scsi::AluaState::Unavailable);
                newly = true;
                tracing::error!(target = %t.name, group = tag,
                    "the storage has fenced this server: port group unavailable until it reconnects");
            }
        } else if let Some(before) = fenced.remove(&key) {
            if t.tpgs.state_of(tag) == scsi::AluaState::Unavailable {
                t.tpgs.set_state(tag, before);
                info!(target = %t.name, group = tag, state = ?before,
                    "the storage takes this server again: port group back");
            }
        }
    }
    newly
}
