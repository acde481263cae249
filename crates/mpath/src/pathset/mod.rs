//! The set of paths of one multipath device and their health: pings, timeouts, demotion,
//! reconnects, failback and the round-robin subset. Sans-IO: the driver reports what happened
//! with the current time, asks `poll_timeout` when to call `handle_timeout`, and drains
//! `poll_event` for what to do. See [`crate::state`] for the state diagram.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::health::{Event, HealthConfig, Human, PathSample};
use crate::path::{tier_name, PathId, TIER_NO_IO, TIER_OPTIMIZED};
use crate::policy::{Failback, Policy};
use crate::state::PathState;

/// State changes kept per path for `history`.
pub const HISTORY_LEN: usize = 16;

/// Slow samples in a row before a latency demotion.
const SLOW_SAMPLES: u32 = 2;

/// All paths of one device and their health. Runs at the pace of pings and ticks, under the
/// driver's lock; the per-request choice is [`Selector`](crate::Selector)'s.
#[derive(Debug)]
pub struct PathSet {
    config: HealthConfig,
    /// Size of the round-robin subset, for `Policy::RoundRobinSubset`.
    subset: Option<usize>,
    /// The failback gate applies (`Policy::Failover`).
    failover: bool,
    paths: Vec<Path>,
    events: VecDeque<Event>,
    generation: u64,
    /// The latest `now` any call brought, for `failback_now`, which has none.
    last_now: Option<Instant>,
}

#[derive(Debug)]
struct Path {
    id: PathId,
    name: String,
    weight: u32,
    priority: u32,
    tier: u8,
    state: PathState,
    /// When the next ping is due; set while logged in.
    next_ping: Option<Instant>,
    /// The last ping asked for has not been answered.
    ping_outstanding: bool,
    /// Last sign of life: a ping answer or a completed command (see `contact`).
    last_contact: Option<Instant>,
    misses: u32,
    rtt: Option<Duration>,
    /// When to emit the next `Reconnect`; set while Failed.
    reconnect_at: Option<Instant>,
    /// p50 latency of the last sample, if it had completions.
    p50: Option<Duration>,
    slow_samples: u32,
    /// Passed its probe but held in Probing by the failback gate.
    hold: Option<Hold>,
    history: Vec<(Instant, &'static str, String)>,
}

/// A recovered path waiting for failback.
#[derive(Debug, Clone, Copy)]
struct Hold {
    /// `None`: until `failback_now`.
    until: Option<Instant>,
    /// The path it would take over from; the hold ends when that one stops carrying I/O.
    behind: PathId,
}

impl Path {
    /// Active at an ALUA tier that carries I/O.
    fn usable(&self) -> bool {
        matches!(self.state, PathState::Active { .. }) && self.tier < TIER_NO_IO
    }

    /// Order of preference of the failover policy: better tier, then higher priority, then
    /// lower id (as the selector breaks ties by index).
    fn failover_rank(&self) -> (u8, std::cmp::Reverse<u32>, PathId) {
        (self.tier, std::cmp::Reverse(self.priority), self.id)
    }
}

impl PathSet {
    /// A path set without policy-specific rules (no round-robin subset, no failback gate).
    pub fn new(config: HealthConfig) -> PathSet {
        PathSet::with_policy(config, &Policy::ServiceTime)
    }

    /// A path set that applies the rules of `policy`: the active subset of
    /// `Policy::RoundRobinSubset` and the failback gate of `Policy::Failover`.
    pub fn with_policy(config: HealthConfig, policy: &Policy) -> PathSet {
        let subset = match policy {
            Policy::RoundRobinSubset { active } => Some((*active).max(1)),
            _ => None,
        };
        PathSet {
            config,
            subset,
            failover: *policy == Policy::Failover,
            paths: Vec::new(),
            events: VecDeque::new(),
            generation: 0,
            last_now: None,
        }
    }

    pub fn config(&self) -> &HealthConfig {
        &self.config
    }

    /// A new path, Connecting: the driver is starting its first login.
    pub fn add(&mut self, name: String, weight: u32, priority: u32, now: Instant) -> PathId {
        self.saw(now);
        let id = PathId(u32::try_from(self.paths.len()).unwrap_or(u32::MAX));
        let history = vec![(now, PathState::Connecting.name(), "added".to_string())];
        self.paths.push(Path {
            id,
            name,
            weight: weight.max(1),
            priority,
            tier: TIER_OPTIMIZED,
            state: PathState::Connecting,
            next_ping: None,
            last_contact: None,
            ping_outstanding: false,
            misses: 0,
            rtt: None,
            reconnect_at: None,
            p50: None,
            slow_samples: 0,
            hold: None,
            history,
        });
        self.generation += 1;
        id
    }

    /// The path's login succeeded. The first login makes it Active at once (the login itself
    /// proved the path, and the device should be usable without waiting); a re-login makes it
    /// Probing until `probe_successes` pings are answered.
    pub fn logged_in(&mut self, id: PathId, now: Instant) {
        let Some(i) = self.index(id) else { return };
        let probes = self.config.probe_successes;
        match self.state_at(i) {
            Some(PathState::Connecting) => {
                self.transition(i, PathState::Active { since: now }, "logged in".into(), now)
            }
            Some(PathState::Failed { .. }) if probes == 0 => {
                self.transition(i, PathState::Active { since: now }, "logged in".into(), now)
            }
            Some(PathState::Failed { .. }) => self.transition(
                i,
                PathState::Probing {
                    since: now,
                    good: 0,
                },
                "logged in, probing".into(),
                now,
            ),
            _ => return,
        }
        self.settle(now);
    }

    /// A login attempt failed: the path is (or stays) Failed and gets `Reconnect` again after
    /// `reconnect_interval`.
    pub fn login_failed(&mut self, id: PathId, reason: String, now: Instant) {
        let Some(i) = self.index(id) else { return };
        let reconnect_at = now + self.config.reconnect_interval;
        let Some(path) = self.paths.get_mut(i) else {
            return;
        };
        match &mut path.state {
            PathState::Failed { reason: r, .. } => {
                // Not a state change: keep `since`, show the latest cause, and count the
                // interval from this attempt so failing logins are not retried back to back.
                *r = format!("login failed: {reason}");
                path.reconnect_at = Some(reconnect_at);
            }
            PathState::Connecting => {
                let state = PathState::Failed {
                    since: now,
                    reason: format!("login failed: {reason}"),
                };
                self.transition(i, state, format!("login failed: {reason}"), now);
                self.settle(now);
            }
            PathState::Removed => {}
            _ => self.fail(i, format!("login failed: {reason}"), now),
        }
    }

    /// The path's connection is gone: Failed, with `Event::Fail` so its commands are replayed.
    pub fn connection_lost(&mut self, id: PathId, reason: String, now: Instant) {
        let Some(i) = self.index(id) else { return };
        if matches!(
            self.state_at(i),
            Some(PathState::Failed { .. } | PathState::Removed) | None
        ) {
            return;
        }
        self.fail(i, format!("connection lost: {reason}"), now);
    }

    /// A ping went out on the path (normally in answer to `Event::SendPing`, which already
    /// counts it as outstanding; a driver that pings on its own reports it here).
    pub fn ping_sent(&mut self, id: PathId, now: Instant) {
        self.saw(now);
        if let Some(p) = self.path_mut(id) {
            if p.state.is_logged_in() {
                p.ping_outstanding = true;
            }
        }
    }

    /// A ping was answered: the path is alive, misses start over, and a probing path counts it.
    pub fn ping_answered(&mut self, id: PathId, rtt: Duration, now: Instant) {
        self.saw(now);
        let Some(i) = self.index(id) else { return };
        let needed = self.config.probe_successes;
        let Some(p) = self.paths.get_mut(i) else {
            return;
        };
        if !p.state.is_logged_in() {
            return;
        }
        p.ping_outstanding = false;
        p.misses = 0;
        p.rtt = Some(rtt);
        p.last_contact = Some(p.last_contact.map_or(now, |c| c.max(now)));
        let held = p.hold.is_some();
        if let PathState::Probing { good, .. } = &mut p.state {
            *good = good.saturating_add(1);
            if *good >= needed && !held {
                self.probe_passed(i, now);
                self.settle(now);
            }
        }
    }

    /// The path's ALUA tier (as in `PathView::tier`), from REPORT TARGET PORT GROUPS or a unit
    /// attention. A change is logged as a `StateChanged` within the same state.
    pub fn set_alua(&mut self, id: PathId, tier: u8, now: Instant) {
        let Some(p) = self.path_mut(id) else { return };
        if p.tier == tier || p.state == PathState::Removed {
            return;
        }
        let reason = format!("ALUA {} -> {}", tier_name(p.tier), tier_name(tier));
        p.tier = tier;
        let (path, name) = (p.id, p.state.name());
        Self::record(p, now, name, reason.clone());
        self.events.push_back(Event::StateChanged {
            path,
            from: name,
            to: name,
            reason,
        });
        self.generation += 1;
        self.settle(now);
    }

    /// One tick's counters of the path: command timeout, error and latency demotion.
    pub fn sample(&mut self, id: PathId, s: PathSample, now: Instant) {
        self.saw(now);
        let Some(i) = self.index(id) else { return };
        let config = &self.config;
        let Some(p) = self.paths.get_mut(i) else {
            return;
        };
        if !p.state.is_logged_in() {
            return;
        }
        if let Some(age) = s
            .oldest_inflight
            .filter(|age| *age >= config.command_timeout)
        {
            let reason = format!(
                "command outstanding {} (timeout {})",
                Human(age),
                Human(config.command_timeout)
            );
            self.fail(i, reason, now);
            return;
        }
        p.p50 = (s.completed > 0).then_some(s.latency_p50);
        if !matches!(p.state, PathState::Active { .. }) {
            return;
        }
        if config.error_threshold > 0 && s.errors >= u64::from(config.error_threshold) {
            let reason = format!(
                "{} errors in one sample (threshold {})",
                s.errors, config.error_threshold
            );
            self.demote(i, reason, now);
            return;
        }
        let Some(mine) = p.p50 else { return };
        let slow = match self.best_other_p50(i) {
            Some((best, other))
                if mine > self.config.latency_floor
                    && mine.as_secs_f64() > self.config.latency_factor * best.as_secs_f64() =>
            {
                Some(format!(
                    "latency {} vs {} on {other}",
                    Human(mine),
                    Human(best)
                ))
            }
            _ => None,
        };
        let Some(p) = self.paths.get_mut(i) else {
            return;
        };
        match slow {
            Some(reason) => {
                p.slow_samples = p.slow_samples.saturating_add(1);
                if p.slow_samples >= SLOW_SAMPLES {
                    self.demote(i, reason, now);
                }
            }
            None => p.slow_samples = 0,
        }
    }

    /// The manual failback trigger: every path held by the failback gate becomes Active (as of
    /// the latest time the set was told).
    pub fn failback_now(&mut self) {
        let Some(now) = self.last_now else { return };
        for i in 0..self.paths.len() {
            if self.paths.get(i).is_some_and(|p| p.hold.is_some()) {
                self.transition(
                    i,
                    PathState::Active { since: now },
                    "manual failback".into(),
                    now,
                );
            }
        }
        self.settle(now);
    }

    /// Takes the path out for good (the driver logs out and moves its commands itself).
    pub fn remove(&mut self, id: PathId, now: Instant) {
        let Some(i) = self.index(id) else { return };
        if self.state_at(i) == Some(&PathState::Removed) {
            return;
        }
        self.transition(i, PathState::Removed, "removed".into(), now);
        self.settle(now);
    }

    /// The earliest time `handle_timeout` has something to do.
    /// A completed command on the path at `at`: as good a sign of life as a ping answer. A
    /// path is failed once it has been silent for `ping_misses` ping intervals while a ping is
    /// outstanding, which, under load, counts from the moment the path went dark rather than
    /// from the first ping sent after it.
    pub fn contact(&mut self, id: PathId, at: Instant) {
        if let Some(p) = self.path_mut(id) {
            if p.state.is_logged_in() && p.last_contact.is_none_or(|c| at > c) {
                p.last_contact = Some(at);
                // The path answers, only its pings are slow (queued behind data): not a miss.
                p.misses = 0;
            }
        }
    }

    /// When a path that stays silent is failed: `ping_misses` intervals after its last contact,
    /// while a ping is outstanding.
    fn silence_deadline(config: &HealthConfig, p: &Path) -> Option<Instant> {
        if !p.ping_outstanding || !p.state.is_logged_in() {
            return None;
        }
        let window = config.ping_interval * config.ping_misses.max(1);
        p.last_contact.map(|c| c + window)
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let demote_for = self.config.demote_for;
        self.paths
            .iter()
            .flat_map(|p| {
                let demoted_until = match p.state {
                    PathState::Demoted { since, .. } => Some(since + demote_for),
                    _ => None,
                };
                [
                    Self::silence_deadline(&self.config, p),
                    p.next_ping,
                    p.reconnect_at,
                    demoted_until,
                    p.hold.and_then(|h| h.until),
                ]
            })
            .flatten()
            .min()
    }

    /// Runs whatever is due at `now`: pings and ping misses, reconnects, the end of demotions
    /// and failback delays.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.saw(now);
        let interval = self.config.ping_interval;
        let misses_allowed = self.config.ping_misses.max(1);
        for i in 0..self.paths.len() {
            let Some(p) = self.paths.get_mut(i) else {
                continue;
            };
            if p.reconnect_at.is_some_and(|at| at <= now) {
                p.reconnect_at = Some(now + self.config.reconnect_interval);
                self.events.push_back(Event::Reconnect(p.id));
                continue;
            }
            if let Some(hold) = p.hold {
                if hold.until.is_some_and(|until| until <= now) {
                    let reason = match self.config.failback {
                        Failback::After(d) => format!("failback after {}", Human(d)),
                        _ => "failback".to_string(),
                    };
                    self.transition(i, PathState::Active { since: now }, reason, now);
                }
            }
            let Some(p) = self.paths.get_mut(i) else {
                continue;
            };
            if let PathState::Demoted { since, .. } = p.state {
                if since + self.config.demote_for <= now {
                    let probing = PathState::Probing {
                        since: now,
                        good: 0,
                    };
                    self.transition(i, probing, "demotion over, probing".into(), now);
                }
            }
            let Some(p) = self.paths.get_mut(i) else {
                continue;
            };
            if Self::silence_deadline(&self.config, p).is_some_and(|at| at <= now) {
                let silent = p.last_contact.map_or(Duration::ZERO, |c| now - c);
                let reason = format!(
                    "no answer for {} ms ({} ping intervals) with a ping outstanding",
                    silent.as_millis(),
                    misses_allowed
                );
                self.fail(i, reason, now);
                continue;
            }
            let Some(p) = self.paths.get_mut(i) else {
                continue;
            };
            if p.next_ping.is_some_and(|due| due <= now) {
                if p.ping_outstanding {
                    p.misses += 1;
                    if p.misses >= misses_allowed {
                        let reason = format!("{} pings unanswered", p.misses);
                        self.fail(i, reason, now);
                        continue;
                    }
                }
                p.ping_outstanding = true;
                p.next_ping = Some(now + interval);
                self.events.push_back(Event::SendPing(p.id));
            }
        }
        self.settle(now);
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// What `PathView::eligible` should be: Active, at an ALUA tier that carries I/O, and (for
    /// `round-robin-subset`) among the first `active` such paths by id.
    pub fn eligible(&self, id: PathId) -> bool {
        let Some(p) = self.path(id) else { return false };
        if !p.usable() {
            return false;
        }
        match self.subset {
            None => true,
            Some(n) => {
                self.paths
                    .iter()
                    .take_while(|q| q.id < id)
                    .filter(|q| q.usable())
                    .count()
                    < n
            }
        }
    }

    /// ALUA tier of the path ([`TIER_NO_IO`] for an unknown id).
    pub fn tier(&self, id: PathId) -> u8 {
        self.path(id).map_or(TIER_NO_IO, |p| p.tier)
    }

    pub fn state(&self, id: PathId) -> Option<&PathState> {
        self.path(id).map(|p| &p.state)
    }

    /// The last [`HISTORY_LEN`] state changes of the path: time, new state, reason.
    pub fn history(&self, id: PathId) -> &[(Instant, &'static str, String)] {
        self.path(id).map_or(&[], |p| p.history.as_slice())
    }

    /// Ids of the paths not removed, in order.
    pub fn ids(&self) -> impl Iterator<Item = PathId> + '_ {
        self.paths
            .iter()
            .filter(|p| p.state != PathState::Removed)
            .map(|p| p.id)
    }

    /// The name given to `add` ("" for an unknown id).
    pub fn name(&self, id: PathId) -> &str {
        self.path(id).map_or("", |p| p.name.as_str())
    }

    pub fn weight(&self, id: PathId) -> u32 {
        self.path(id).map_or(1, |p| p.weight)
    }

    pub fn priority(&self, id: PathId) -> u32 {
        self.path(id).map_or(0, |p| p.priority)
    }

    /// Round-trip time of the last answered ping.
    pub fn rtt(&self, id: PathId) -> Option<Duration> {
        self.path(id).and_then(|p| p.rtt)
    }

    /// The path passed its probe but waits for failback (failover policy, failback not
    /// immediate, and it would take over from the path now carrying I/O).
    pub fn failback_pending(&self, id: PathId) -> bool {
        self.path(id).is_some_and(|p| p.hold.is_some())
    }

    /// Changes whenever `eligible` or `tier` of any path may have changed, so a driver can
    /// cache its `PathView`s and refresh them only then.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

mod rules;

#[cfg(test)]
mod tests;
