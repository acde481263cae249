//! A multipath device: one LUN reached through every portal of a target, as one device that
//! is as fast as the sum of its paths and survives losing all but one of them.
//!
//! - [`Multipath::attach`] logs in once per portal, reads VPD page 0x83 on every path and
//!   keeps only paths whose LUN identifier (and size) is identical: a path that reports another
//!   identifier is refused, because mixing two LUNs in one device corrupts data.
//! - Requests go to the path the `mpath` selector picks from per-path atomic counters; large
//!   requests are split across the eligible paths (`mpath::split`).
//! - A health task pings every path (NOP-Out), samples latency and errors, and drives
//!   `mpath::PathSet`: failed paths are closed abortively, fenced, and logged in again.
//! - A command that fails with its path is replayed on another one; a write only after the
//!   failed path's session has been ended at the target ([`io`] and [`health`] say how).

mod health;
mod io;
mod mcs;
mod ops;
mod slot;
mod status;

use mpath::{HealthConfig, PathId, PathSet, Policy, Selector};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::{Error, LoginOptions};
use slot::PathSlot;
pub use status::{MultipathStatus, PathStatus, StateChange};

/// Most paths one device has.
pub const MAX_PATHS: usize = 32;
/// Largest single command sent down one path; bigger requests are cut.
const MAX_COMMAND_BYTES: u64 = 1 << 20;

/// One portal of the device and how the policies weigh it.
#[derive(Debug, Clone)]
pub struct PortalConfig {
    pub addr: SocketAddr,
    /// Target portal group tag (from SendTargets); sessions are identified per group.
    pub tpgt: u16,
    pub weight: u32,
    pub priority: u32,
    /// Local interface this path's connections leave through (None: the routing table decides).
    pub interface: Option<String>,
}

/// Everything `Multipath::attach` needs.
#[derive(Debug, Clone)]
pub struct MultipathConfig {
    pub target: String,
    pub portals: Vec<PortalConfig>,
    /// Initiator name, CHAP and LUN; the ISID is chosen per path.
    pub login: LoginOptions,
    pub policy: Policy,
    pub health: HealthConfig,
    /// With every path down, how long I/O waits before it fails.
    pub no_path_timeout: Duration,
    /// Requests larger than this are split across the eligible paths.
    pub split_threshold: u32,
    /// One session with one connection per portal (MC/S) instead of one session per portal.
    pub mcs: bool,
}

impl MultipathConfig {
    pub fn new(target: impl Into<String>, portals: Vec<PortalConfig>, login: LoginOptions) -> Self {
        MultipathConfig {
            target: target.into(),
            portals,
            login,
            policy: Policy::default(),
            health: HealthConfig::default(),
            no_path_timeout: Duration::from_secs(30),
            split_threshold: 128 << 10,
            mcs: false,
        }
    }
}

/// A path attach could not use.
#[derive(Debug, Clone)]
pub struct RefusedPath {
    pub portal: SocketAddr,
    pub reason: String,
}

pub(crate) struct Inner {
    config: MultipathConfig,
    me: Weak<Inner>,
    /// Time base of the per-path completion stamps.
    started: Instant,
    slots: Vec<PathSlot>,
    selector: Selector,
    health: Mutex<PathSet>,
    lun_id: String,
    block_size: u32,
    blocks: u64,
    /// Wakes requests waiting for an eligible path.
    path_change: Notify,
    /// Wakes the health task (a path failed, a ping came back).
    wake: Notify,
    refresh_alua: Notify,
    alua_supported: AtomicBool,
    closing: AtomicBool,
    /// Set while a fence quiesces the device (LOGICAL UNIT RESET); `idle` and `resume` pair
    /// with it.
    paused: AtomicBool,
    idle: Notify,
    resume: Notify,
    /// One LOGICAL UNIT RESET fence at a time (two paths of a dead node fail together), with
    /// when the last successful one was sent: it ended every task of paths that had already
    /// failed by then.
    reset_fence: tokio::sync::Mutex<Option<Instant>>,
    replayed: AtomicU64,
    fences: AtomicU64,
}

/// The device. Cheap to share: clone the `Arc` it lives in.
pub struct Multipath {
    inner: Arc<Inner>,
    refused: Vec<RefusedPath>,
    stop: tokio::sync::watch::Sender<bool>,
    health_task: Mutex<Option<JoinHandle<()>>>,
}

impl Multipath {
    /// Logs in through every portal and builds the device from the paths that agree on the
    /// LUN. Fails when no path could log in.
    pub async fn attach(config: MultipathConfig) -> Result<Multipath, Error> {
        if config.portals.is_empty() {
            return Err(Error::InvalidRequest("no portal to attach through".into()));
        }
        if config.portals.len() > MAX_PATHS {
            return Err(Error::InvalidRequest(format!(
                "{} portals; at most {MAX_PATHS} paths per device",
                config.portals.len()
            )));
        }
        let shared_isid = crate::random_isid();
        let mut config = config;
        if config.mcs {
            config.login.offer.max_connections = u32::try_from(config.portals.len())
                .unwrap_or(u32::MAX)
                .max(2);
        }
        let slots: Vec<PathSlot> = config
            .portals
            .iter()
            .enumerate()
            .map(|(i, p)| {
                // With MC/S every path is a connection of one session: one ISID for all.
                let isid = if config.mcs {
                    shared_isid
                } else {
                    crate::random_isid()
                };
                PathSlot::new(
                    PathId(i as u32),
                    p.addr,
                    p.tpgt,
                    isid,
                    (p.weight, p.priority),
                    p.interface.clone(),
                )
            })
            .collect();
        let logins = if config.mcs {
            mcs_logins(&config, &slots).await
        } else {
            futures_util::future::join_all(slots.iter().map(|s| leading_login(&config, s))).await
        };
        // The first path that logged in defines the device; the others must agree with it.
        let Some(reference) = logins.iter().find_map(|l| l.as_ref().ok()) else {
            let reasons: Vec<String> = slots
                .iter()
                .zip(&logins)
                .filter_map(|(s, l)| {
                    l.as_ref()
                        .err()
                        .map(|e| format!("{}: {}", s.portal, crate::chain(e)))
                })
                .collect();
            return Err(Error::NoPathAtAttach(reasons.join("; ")));
        };
        let (lun_id, blocks, block_size) = (
            reference.lun_id.clone(),
            reference.blocks,
            reference.block_size,
        );
        let mut refused = Vec::new();
        let mut kept = Vec::new();
        let mut sessions = Vec::new();
        for (slot, login) in slots.into_iter().zip(logins) {
            match login {
                Ok(l) if l.lun_id != lun_id || l.blocks != blocks || l.block_size != block_size => {
                    let reason = format!(
                        "it reports LUN {} ({} blocks of {} bytes), the device is {} ({} x {}); \
                         mixing two LUNs in one device would corrupt data",
                        l.lun_id, l.blocks, l.block_size, lun_id, blocks, block_size
                    );
                    warn!(portal = %slot.portal, "refusing path: {reason}");
                    let _ = l.session.logout().await;
                    refused.push(RefusedPath {
                        portal: slot.portal,
                        reason,
                    });
                }
                Ok(l) => {
                    if let Some(g) = l.port_group {
                        slot.port_group.store(g, Ordering::Relaxed);
                    }
                    sessions.push((kept.len(), Some(l.session)));
                    kept.push(slot);
                }
                Err(e) => {
                    warn!(portal = %slot.portal, "path not logged in yet: {}", crate::chain(&e));
                    sessions.push((kept.len(), None));
                    kept.push(slot);
                }
            }
        }
        let now = Instant::now();
        let mut health = PathSet::with_policy(config.health.clone(), &config.policy);
        for slot in &mut kept {
            let id = health.add(slot.portal.to_string(), slot.weight, slot.priority, now);
            slot.id = id;
        }
        for (i, session) in sessions {
            let Some(slot) = kept.get(i) else { continue };
            match session {
                Some(s) => {
                    slot.install(s);
                    health.logged_in(slot.id, now);
                }
                None => health.login_failed(slot.id, "first login failed".into(), now),
            }
        }
        let inner = Arc::new_cyclic(|me| Inner {
            selector: Selector::new(config.policy.clone()),
            config,
            me: me.clone(),
            started: Instant::now(),
            slots: kept,
            health: Mutex::new(health),
            lun_id,
            block_size,
            blocks,
            path_change: Notify::new(),
            wake: Notify::new(),
            refresh_alua: Notify::new(),
            alua_supported: AtomicBool::new(true),
            closing: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            idle: Notify::new(),
            resume: Notify::new(),
            reset_fence: tokio::sync::Mutex::new(None),
            replayed: AtomicU64::new(0),
            fences: AtomicU64::new(0),
        });
        inner.sync_eligibility(&inner.health());
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(health::run(inner.clone(), stop_rx));
        info!(
            lun = %inner.lun_id,
            paths = inner.slots.len(),
            refused = refused.len(),
            "multipath device attached"
        );
        Ok(Multipath {
            inner,
            refused,
            stop,
            health_task: Mutex::new(Some(task)),
        })
    }

    /// The LUN identifier every path agreed on (`naa.…`).
    pub fn lun_id(&self) -> &str {
        &self.inner.lun_id
    }

    pub fn block_size(&self) -> u32 {
        self.inner.block_size
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.inner
            .blocks
            .saturating_mul(u64::from(self.inner.block_size))
    }

    /// Paths attach refused (another LUN behind the portal).
    pub fn refused(&self) -> &[RefusedPath] {
        &self.refused
    }

    /// Failback for the failover policy with manual failback.
    pub fn failback_now(&self) {
        let mut h = self.inner.health();
        h.failback_now();
        self.inner.sync_eligibility(&h);
    }

    /// Waits for in-flight I/O (up to `drain`), flushes, and logs out of every path.
    pub async fn detach(&self, drain: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + drain;
        loop {
            let busy: u32 = self
                .inner
                .slots
                .iter()
                .map(|s| s.inflight_cmds.load(Ordering::Relaxed))
                .sum();
            if busy == 0 || Instant::now() >= deadline {
                break;
            }
            // Polling a counter, not synchronizing: in-flight commands end on their own.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let flushed = self.flush().await;
        self.inner.closing.store(true, Ordering::Relaxed);
        let _ = self.stop.send(true);
        let task = self
            .health_task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = task {
            let _ = t.await;
        }
        let mut logged_out = false;
        for slot in &self.inner.slots {
            let epoch = slot.epoch.load(Ordering::Acquire);
            if let Some(s) = slot.take(epoch) {
                slot.eligible.store(false, Ordering::Relaxed);
                if self.inner.config.mcs && logged_out {
                    // The session's logout closed this connection too.
                    s.kill();
                    continue;
                }
                if let Ok(s) = Arc::try_unwrap(s) {
                    let _ = tokio::time::timeout(Duration::from_secs(5), s.logout()).await;
                    logged_out = true;
                }
            }
        }
        self.inner.path_change.notify_waiters();
        info!(lun = %self.inner.lun_id, "multipath device detached");
        flushed
    }

    /// Paths, their states and counters, and the device's totals.
    pub fn status(&self) -> MultipathStatus {
        status::collect(&self.inner)
    }
}

impl Drop for Multipath {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for slot in &self.inner.slots {
            if let Some((s, _)) = slot.current() {
                s.kill();
            }
        }
    }
}

/// A new session through the path's portal, at attach time.
async fn leading_login(config: &MultipathConfig, s: &PathSlot) -> Result<health::PathLogin, Error> {
    health::login_path(
        s.portal,
        &config.target,
        &s.options(&config.login),
        s.isid,
        health::ATTACH_TIMEOUT,
    )
    .await
}

/// MC/S: the first portal that accepts a leading login starts the session; every other
/// portal joins it as a connection.
async fn mcs_logins(
    config: &MultipathConfig,
    slots: &[PathSlot],
) -> Vec<Result<health::PathLogin, Error>> {
    let mut out: Vec<Result<health::PathLogin, Error>> = Vec::with_capacity(slots.len());
    let mut lead: Option<usize> = None;
    for s in slots {
        let login = match lead.and_then(|i| out.get(i)).and_then(|l| l.as_ref().ok()) {
            Some(l) => {
                mcs::login_connection(
                    &l.session,
                    s.portal,
                    &config.target,
                    &s.options(&config.login),
                    s.isid,
                    s.cid,
                    health::ATTACH_TIMEOUT,
                )
                .await
            }
            None => leading_login(config, s).await,
        };
        if login.is_ok() && lead.is_none() {
            lead = Some(out.len());
        }
        out.push(login);
    }
    out
}
