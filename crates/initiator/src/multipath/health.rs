//! The health task of a multipath device: drives `mpath::PathSet` (pings, misses, demotion,
//! reconnects) with the real clock, logs every path state change once, re-reads ALUA states,
//! and fences failed paths (session reinstatement through a surviving portal of the same
//! portal group) so their writes can be replayed safely.

use mpath::{Event, PathSample};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

use super::slot::{quantile, Rates, BUCKETS};
use super::Inner;
use crate::{LoginOptions, Session};

/// How long one login (connect + login exchange) may take before the attempt counts as failed.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(5);
/// A login at attach time: connect, login, TEST UNIT READY, READ CAPACITY, INQUIRY.
pub(crate) const ATTACH_TIMEOUT: Duration = Duration::from_secs(10);
/// A re-login of a failed path: short, so that a black-holed attempt is abandoned and the
/// next one (every reconnect interval) finds the healed path quickly.
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often ALUA states are re-read (and at once after an ALUA sense).
const ALUA_INTERVAL: Duration = Duration::from_secs(1);

/// What a login of one path found.
pub(crate) struct PathLogin {
    pub(crate) session: Session,
    pub(crate) lun_id: String,
    pub(crate) blocks: u64,
    pub(crate) block_size: u32,
    pub(crate) port_group: Option<u16>,
}

/// Reads what identifies the LUN through a freshly logged-in path.
pub(crate) async fn identify(session: Session) -> Result<PathLogin, crate::Error> {
    session.test_unit_ready().await?;
    let (blocks, block_size) = session.read_capacity16().await?;
    let identity = session.device_identity().await?;
    let lun_id = identity.lun.ok_or_else(|| {
        crate::Error::Protocol(
            "the LUN reports no identifier of its own in VPD page 0x83 (NAA, EUI-64, SCSI name, \
             or a T10 vendor ID with a serial), so its paths cannot be told from another LUN's"
                .into(),
        )
    })?;
    Ok(PathLogin {
        session,
        lun_id,
        blocks,
        block_size,
        port_group: identity.target_port_group,
    })
}

/// Logs in through `portal` with `isid` and reads what identifies the LUN there.
pub(crate) async fn login_path(
    portal: std::net::SocketAddr,
    target: &str,
    options: &LoginOptions,
    isid: [u8; 6],
    limit: Duration,
) -> Result<PathLogin, crate::Error> {
    let opts = LoginOptions {
        isid,
        ..options.clone()
    };
    let work = async {
        let session = Session::login(portal, target, &opts).await?;
        identify(session).await
    };
    tokio::time::timeout(limit, work)
        .await
        .map_err(|_| crate::Error::Timeout("a path's login"))?
}

impl Inner {
    /// Makes PathSet's verdicts visible to the selector and wakes requests waiting for a path.
    pub(crate) fn sync_eligibility(&self, health: &mpath::PathSet) {
        for slot in &self.slots {
            let eligible = health.eligible(slot.id) && slot.current().is_some();
            slot.eligible.store(eligible, Ordering::Relaxed);
            slot.tier.store(health.tier(slot.id), Ordering::Relaxed);
        }
        self.path_change.notify_waiters();
    }

    pub(crate) fn health(&self) -> std::sync::MutexGuard<'_, mpath::PathSet> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The path's session of `epoch` failed: close it abortively, tell PathSet (unless it told
    /// us), and start fencing it. Idempotent per epoch.
    pub(crate) fn fail_path(self: &Inner, index: usize, epoch: u64, reason: String, tell: bool) {
        let Some(slot) = self.slots.get(index) else {
            return;
        };
        let Some(session) = slot.take(epoch) else {
            return;
        };
        slot.eligible.store(false, Ordering::Relaxed);
        let taken = session.kill();
        {
            let mut h = self.health();
            if tell {
                h.connection_lost(slot.id, reason, Instant::now());
            }
            self.sync_eligibility(&h);
        }
        self.wake.notify_one();
        if let Some(me) = self.me.upgrade() {
            if self.config.mcs {
                tokio::spawn(async move { me.fence_connection(index, epoch, taken).await });
            } else {
                tokio::spawn(async move { me.fence(index, epoch).await });
            }
        }
    }

    /// Makes sure the target has ended the session of `epoch` on path `index`: a login with
    /// the path's ISID through another portal of the same portal group reinstates (ends) it,
    /// and the target answers that login only after the old session's tasks are gone.
    async fn fence(&self, index: usize, epoch: u64) {
        let failed_at = Instant::now();
        let Some(slot) = self.slots.get(index) else {
            return;
        };
        let _serial = slot.login_lock.lock().await;
        if *slot.fenced.borrow() >= epoch {
            return;
        }
        for other in &self.slots {
            if other.id == slot.id || other.tpgt != slot.tpgt || other.current().is_none() {
                continue;
            }
            // The failed path's session id, through the surviving path's portal and interface.
            let opts = LoginOptions {
                isid: slot.isid,
                ..other.options(&self.config.login)
            };
            let attempt = tokio::time::timeout(
                LOGIN_TIMEOUT,
                Session::login(other.portal, &self.config.target, &opts),
            )
            .await;
            match attempt {
                Ok(Ok(fence)) => {
                    let _ = tokio::time::timeout(LOGIN_TIMEOUT, fence.logout()).await;
                    slot.fenced.send_modify(|f| *f = (*f).max(epoch));
                    self.fences.fetch_add(1, Ordering::Relaxed);
                    info!(
                        path = %slot.id, portal = %slot.portal, through = %other.portal,
                        "fenced: the target ended the failed path's session (reinstatement); its writes are replayed"
                    );
                    return;
                }
                Ok(Err(e)) => {
                    warn!(path = %slot.id, through = %other.portal, "fencing login failed: {e}")
                }
                Err(_) => {
                    warn!(path = %slot.id, through = %other.portal, "fencing login timed out")
                }
            }
        }
        // No surviving portal in the failed path's portal group (each portal its own ALUA
        // group, say, or every portal of a dead node at once): a LOGICAL UNIT RESET through a
        // surviving path makes the target end every task of the LUN, the failed session's
        // included, and answer only then (SAM-5 6.3). Our own commands are drained first so
        // that the reset aborts none of them. Resets run one at a time: two paths failing
        // together must not resume I/O while the other's reset is on its way.
        self.reset_fence_path(index, epoch, failed_at).await;
    }

    /// The LOGICAL UNIT RESET fence of path `index` (failed at `failed_at`), through each
    /// eligible path in turn until one answers.
    async fn reset_fence_path(&self, index: usize, epoch: u64, failed_at: Instant) {
        let Some(slot) = self.slots.get(index) else {
            return;
        };
        let mut last_reset = self.reset_fence.lock().await;
        if last_reset.is_some_and(|sent| sent >= failed_at) {
            // A reset sent after this path failed already ended its tasks.
            slot.fenced.send_modify(|f| *f = (*f).max(epoch));
            self.fences.fetch_add(1, Ordering::Relaxed);
            info!(
                path = %slot.id, portal = %slot.portal,
                "fenced: the LOGICAL UNIT RESET sent for another failed path ended this one's tasks too; its writes are replayed"
            );
            return;
        }
        let candidates: Vec<usize> = (0..self.slots.len())
            .filter(|i| *i != index)
            .filter(|i| {
                self.slots
                    .get(*i)
                    .is_some_and(|s| s.eligible.load(Ordering::Relaxed) && s.current().is_some())
            })
            .collect();
        if candidates.is_empty() {
            warn!(
                path = %slot.id, portal = %slot.portal,
                "no surviving path to fence through: its in-flight writes wait until the path logs in again"
            );
            return;
        }
        self.quiesce().await;
        let mut fenced_through = None;
        for i in candidates {
            let Some((via, _)) = self.slots.get(i).and_then(|s| s.current()) else {
                continue;
            };
            let sent = Instant::now();
            match tokio::time::timeout(LOGIN_TIMEOUT, via.lun_reset()).await {
                Ok(Ok(())) => {
                    *last_reset = Some(sent);
                    fenced_through = self.slots.get(i).map(|s| s.portal);
                    break;
                }
                Ok(Err(e)) => {
                    warn!(path = %slot.id, through = %via.portal(), "fencing LOGICAL UNIT RESET failed: {e}")
                }
                Err(_) => {
                    warn!(path = %slot.id, through = %via.portal(), "fencing LOGICAL UNIT RESET timed out")
                }
            }
        }
        self.paused.store(false, Ordering::SeqCst);
        self.resume.notify_waiters();
        match fenced_through {
            Some(through) => {
                slot.fenced.send_modify(|f| *f = (*f).max(epoch));
                self.fences.fetch_add(1, Ordering::Relaxed);
                info!(
                    path = %slot.id, portal = %slot.portal, through = %through,
                    "fenced: LOGICAL UNIT RESET ended the failed path's tasks (no other portal in its group); its writes are replayed"
                );
            }
            None => warn!(
                path = %slot.id,
                "no LOGICAL UNIT RESET got through; writes wait for the path's own login"
            ),
        }
    }

    /// Stops new commands and waits until none is in flight on any path.
    async fn quiesce(&self) {
        self.paused.store(true, Ordering::SeqCst);
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            let busy: u32 = self
                .slots
                .iter()
                .map(|s| s.inflight_cmds.load(Ordering::SeqCst))
                .sum();
            if busy == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Logs path `index` in again (with its ISID, which also fences its old session).
    async fn reconnect(&self, index: usize) {
        let Some(slot) = self.slots.get(index) else {
            return;
        };
        let result = {
            let _serial = slot.login_lock.lock().await;
            let login = if self.config.mcs {
                self.reconnect_connection(index, RECONNECT_TIMEOUT).await
            } else {
                login_path(
                    slot.portal,
                    &self.config.target,
                    &slot.options(&self.config.login),
                    slot.isid,
                    RECONNECT_TIMEOUT,
                )
                .await
            };
            match login {
                Ok(login)
                    if login.lun_id != self.lun_id
                        || login.block_size != self.block_size
                        || login.blocks != self.blocks =>
                {
                    let _ = login.session.logout().await;
                    Err(format!(
                        "refused: the portal now reports LUN {} ({} x {} bytes), not {}",
                        login.lun_id, login.blocks, login.block_size, self.lun_id
                    ))
                }
                Ok(login) => {
                    if let Some(g) = login.port_group {
                        slot.port_group.store(g, Ordering::Relaxed);
                    }
                    slot.install(login.session);
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            }
        };
        slot.reconnecting.store(false, Ordering::Release);
        {
            let mut h = self.health();
            match result {
                Ok(()) => h.logged_in(slot.id, Instant::now()),
                Err(reason) => h.login_failed(slot.id, reason, Instant::now()),
            }
            self.sync_eligibility(&h);
        }
        self.refresh_alua.notify_one();
        self.wake.notify_one();
    }

    /// Reads the ALUA states through one live path and hands each path its tier.
    async fn refresh_alua_states(&self) {
        if !self.alua_supported.load(Ordering::Relaxed) {
            return;
        }
        let Some((session, _)) = self.slots.iter().find_map(|s| s.current()) else {
            return;
        };
        match tokio::time::timeout(LOGIN_TIMEOUT, session.report_target_port_groups()).await {
            Ok(Ok(groups)) => {
                let mut h = self.health();
                let now = Instant::now();
                for slot in &self.slots {
                    let group = slot.port_group.load(Ordering::Relaxed);
                    if let Some(g) = groups.iter().find(|g| g.group == group) {
                        h.set_alua(slot.id, g.tier(), now);
                    }
                }
                self.sync_eligibility(&h);
            }
            Ok(Err(crate::Error::Scsi { .. })) => {
                info!(
                    "the target does not report ALUA states; every path counts as active/optimized"
                );
                self.alua_supported.store(false, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// One health tick's samples: per-path deltas of the counters and latency quantiles.
    fn sample(&self, last: &mut [Snapshot], elapsed: Duration) {
        let now = Instant::now();
        let secs = elapsed.as_secs_f64().max(1e-3);
        let mut samples = Vec::with_capacity(self.slots.len());
        for (slot, prev) in self.slots.iter().zip(last.iter_mut()) {
            let s = &slot.stats;
            let completed = s.completed.load(Ordering::Relaxed);
            let bytes = s.bytes.load(Ordering::Relaxed);
            let errors = s.errors.load(Ordering::Relaxed);
            let mut delta = [0u64; BUCKETS];
            for ((d, h), p) in delta.iter_mut().zip(&s.hist).zip(prev.hist.iter_mut()) {
                let v = h.load(Ordering::Relaxed);
                *d = v.saturating_sub(*p);
                *p = v;
            }
            let sample = PathSample {
                completed: completed.saturating_sub(prev.completed),
                bytes: bytes.saturating_sub(prev.bytes),
                errors: errors.saturating_sub(prev.errors),
                latency_p50: Duration::from_micros(quantile(&delta, 0.5)),
                latency_p99: Duration::from_micros(quantile(&delta, 0.99)),
                oldest_inflight: None,
            };
            *slot.rates.lock().unwrap_or_else(|e| e.into_inner()) = Rates {
                iops: sample.completed as f64 / secs,
                bytes_per_sec: sample.bytes as f64 / secs,
                p50_us: quantile(&delta, 0.5),
                p99_us: quantile(&delta, 0.99),
            };
            prev.completed = completed;
            prev.bytes = bytes;
            prev.errors = errors;
            samples.push((slot.id, sample));
        }
        let mut h = self.health();
        for (id, sample) in samples {
            h.sample(id, sample, now);
        }
        self.sync_eligibility(&h);
    }

    fn handle(self: &Arc<Inner>, event: Event) {
        let index_of = |id: mpath::PathId| self.slots.iter().position(|s| s.id == id);
        match event {
            Event::SendPing(id) => {
                let Some(i) = index_of(id) else { return };
                let Some((session, epoch)) = self.slots.get(i).and_then(|s| s.current()) else {
                    return;
                };
                self.health().ping_sent(id, Instant::now());
                let me = self.clone();
                tokio::spawn(async move {
                    match session.ping().await {
                        Ok(rtt) => {
                            let mut h = me.health();
                            h.ping_answered(id, rtt, Instant::now());
                            me.sync_eligibility(&h);
                        }
                        Err(e) => me.fail_path(i, epoch, format!("ping failed: {e}"), true),
                    }
                    me.wake.notify_one();
                });
            }
            Event::Fail { path, reason } => {
                let Some(i) = index_of(path) else { return };
                if let Some(slot) = self.slots.get(i) {
                    let epoch = slot.epoch.load(Ordering::Acquire);
                    self.fail_path(i, epoch, reason, false);
                }
            }
            Event::Reconnect(id) => {
                let Some(i) = index_of(id) else { return };
                let Some(slot) = self.slots.get(i) else {
                    return;
                };
                if slot.reconnecting.swap(true, Ordering::AcqRel) || slot.current().is_some() {
                    if slot.current().is_some() {
                        slot.reconnecting.store(false, Ordering::Release);
                    }
                    return;
                }
                let me = self.clone();
                tokio::spawn(async move { me.reconnect(i).await });
            }
            Event::StateChanged {
                path,
                from,
                to,
                reason,
            } => {
                let portal = index_of(path)
                    .and_then(|i| self.slots.get(i))
                    .map(|s| s.portal.to_string())
                    .unwrap_or_default();
                if to == "failed" || to == "demoted" {
                    warn!(%path, %portal, from, to, "path state changed: {reason}");
                } else {
                    info!(%path, %portal, from, to, "path state changed: {reason}");
                }
            }
        }
    }
}

/// The counters of one path at the previous tick.
pub(crate) struct Snapshot {
    completed: u64,
    bytes: u64,
    errors: u64,
    hist: [u64; BUCKETS],
}

/// The health task: runs until `stop` turns true.
pub(crate) async fn run(inner: Arc<Inner>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let interval = inner.config.health.ping_interval;
    let mut last: Vec<Snapshot> = inner
        .slots
        .iter()
        .map(|_| Snapshot {
            completed: 0,
            bytes: 0,
            errors: 0,
            hist: [0; BUCKETS],
        })
        .collect();
    let mut last_tick = Instant::now();
    let mut next_tick = last_tick + interval;
    let mut next_alua = Instant::now();
    loop {
        let deadline = inner
            .health()
            .poll_timeout()
            .map_or(next_tick, |t| t.min(next_tick))
            .min(next_alua);
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.into()) => {}
            _ = inner.wake.notified() => {}
            _ = inner.refresh_alua.notified() => { next_alua = Instant::now(); }
            _ = stop.wait_for(|s| *s) => return,
        }
        let now = Instant::now();
        if now >= next_tick {
            inner.sample(&mut last, now - last_tick);
            last_tick = now;
            next_tick = now + interval;
        }
        if now >= next_alua {
            next_alua = now + ALUA_INTERVAL;
            let me = inner.clone();
            tokio::spawn(async move { me.refresh_alua_states().await });
        }
        let events: Vec<Event> = {
            let mut h = inner.health();
            // Completed commands are signs of life as good as ping answers.
            for slot in &inner.slots {
                let ns = slot.last_completion.load(Ordering::Relaxed);
                if ns > 0 {
                    h.contact(slot.id, inner.started + Duration::from_nanos(ns));
                }
            }
            h.handle_timeout(now);
            std::iter::from_fn(|| h.poll_event()).collect()
        };
        for event in events {
            inner.handle(event);
        }
    }
}
