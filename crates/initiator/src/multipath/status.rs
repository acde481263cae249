//! What `lanes status` shows of an attached device: every path with its state, ALUA tier,
//! load, rates, latency and recent state changes, plus the device's replay and fence counts.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use super::Inner;

/// One state change of a path, with the wall-clock time it happened.
#[derive(Debug, Clone)]
pub struct StateChange {
    pub at: SystemTime,
    pub to: &'static str,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub struct PathStatus {
    pub path: String,
    pub portal: SocketAddr,
    pub portal_group: u16,
    pub state: String,
    pub alua: &'static str,
    pub eligible: bool,
    pub inflight_cmds: u32,
    pub inflight_bytes: u64,
    pub iops: f64,
    pub bytes_per_sec: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub completed: u64,
    pub errors: u64,
    pub history: Vec<StateChange>,
}

#[derive(Debug, Clone)]
pub struct MultipathStatus {
    pub target: String,
    pub lun_id: String,
    pub policy: String,
    pub block_size: u32,
    pub size: u64,
    /// Commands replayed on another path after theirs failed.
    pub replayed: u64,
    /// Failed sessions the target was made to end before their writes were replayed.
    pub fences: u64,
    pub paths: Vec<PathStatus>,
}

fn wall(at: Instant, now: Instant, wall_now: SystemTime) -> SystemTime {
    wall_now
        .checked_sub(now.saturating_duration_since(at))
        .unwrap_or(wall_now)
}

pub(crate) fn collect(inner: &Inner) -> MultipathStatus {
    let now = Instant::now();
    let wall_now = SystemTime::now();
    let h = inner.health();
    let paths = inner
        .slots
        .iter()
        .map(|s| {
            let rates = *s.rates.lock().unwrap_or_else(|e| e.into_inner());
            let state = h
                .state(s.id)
                .map(|st| format!("{st}"))
                .unwrap_or_else(|| "unknown".into());
            PathStatus {
                path: s.id.to_string(),
                portal: s.portal,
                portal_group: s.port_group.load(Ordering::Relaxed),
                state,
                alua: mpath::tier_name(h.tier(s.id)),
                eligible: s.eligible.load(Ordering::Relaxed),
                inflight_cmds: s.inflight_cmds.load(Ordering::Relaxed),
                inflight_bytes: s.inflight_bytes.load(Ordering::Relaxed),
                iops: rates.iops,
                bytes_per_sec: rates.bytes_per_sec,
                p50_us: rates.p50_us,
                p99_us: rates.p99_us,
                completed: s.stats.completed.load(Ordering::Relaxed),
                errors: s.stats.errors.load(Ordering::Relaxed),
                history: h
                    .history(s.id)
                    .iter()
                    .map(|(at, to, reason)| StateChange {
                        at: wall(*at, now, wall_now),
                        to,
                        reason: reason.clone(),
                    })
                    .collect(),
            }
        })
        .collect();
    MultipathStatus {
        target: inner.config.target.clone(),
        lun_id: inner.lun_id.clone(),
        policy: inner.selector.policy().to_string(),
        block_size: inner.block_size,
        size: inner.blocks.saturating_mul(u64::from(inner.block_size)),
        replayed: inner.replayed.load(Ordering::Relaxed),
        fences: inner.fences.load(Ordering::Relaxed),
        paths,
    }
}
