//! The rules that tie the paths of a set together: transitions with their bookkeeping,
//! demotion and failure, the failback gate, and what must follow any change (`settle`).

use std::time::{Duration, Instant};

use super::{Hold, Path, PathSet, HISTORY_LEN};
use crate::health::Event;
use crate::path::{PathId, TIER_NO_IO};
use crate::policy::Failback;
use crate::state::PathState;

impl PathSet {
    pub(super) fn index(&self, id: PathId) -> Option<usize> {
        let i = usize::try_from(id.0).ok()?;
        (i < self.paths.len()).then_some(i)
    }

    pub(super) fn path(&self, id: PathId) -> Option<&Path> {
        self.paths.get(self.index(id)?)
    }

    pub(super) fn path_mut(&mut self, id: PathId) -> Option<&mut Path> {
        let i = self.index(id)?;
        self.paths.get_mut(i)
    }

    pub(super) fn state_at(&self, i: usize) -> Option<&PathState> {
        self.paths.get(i).map(|p| &p.state)
    }

    /// The lowest p50 among the other Active paths that completed commands in their last
    /// sample, and which path it is.
    pub(super) fn best_other_p50(&self, i: usize) -> Option<(Duration, PathId)> {
        self.paths
            .iter()
            .enumerate()
            .filter(|(j, q)| *j != i && matches!(q.state, PathState::Active { .. }))
            .filter_map(|(_, q)| q.p50.map(|d| (d, q.id)))
            .min()
    }

    /// Whether some path other than `i` carries I/O or is ready to (held for failback).
    pub(super) fn other_usable(&self, i: usize) -> bool {
        self.paths
            .iter()
            .enumerate()
            .any(|(j, q)| j != i && (q.usable() || (q.hold.is_some() && q.tier < TIER_NO_IO)))
    }

    /// Demotes an Active path, unless it is the last usable one: a slow path beats no path.
    pub(super) fn demote(&mut self, i: usize, reason: String, now: Instant) {
        if !self.other_usable(i) {
            return;
        }
        let state = PathState::Demoted {
            since: now,
            reason: reason.clone(),
        };
        self.transition(i, state, reason, now);
        self.settle(now);
    }

    /// A logged-in (or connecting) path goes to Failed; the driver kills its connection.
    pub(super) fn fail(&mut self, i: usize, reason: String, now: Instant) {
        let Some(p) = self.paths.get(i) else { return };
        self.events.push_back(Event::Fail {
            path: p.id,
            reason: reason.clone(),
        });
        let state = PathState::Failed {
            since: now,
            reason: reason.clone(),
        };
        self.transition(i, state, reason, now);
        self.settle(now);
    }

    /// A Probing path answered enough pings: Active, unless the failback gate holds it.
    pub(super) fn probe_passed(&mut self, i: usize, now: Instant) {
        let Some(p) = self.paths.get(i) else { return };
        let until = match self.config.failback {
            Failback::Immediate => None,
            Failback::Manual => Some(None),
            Failback::After(d) => Some(Some(now + d)),
        };
        if let (true, Some(until)) = (self.failover, until) {
            // The path the failover selector uses now; hold only if this one would displace it.
            let current = self
                .paths
                .iter()
                .filter(|q| q.id != p.id && q.usable())
                .min_by_key(|q| q.failover_rank());
            if let Some(current) = current.filter(|c| p.failover_rank() < c.failover_rank()) {
                let hold = Hold {
                    until,
                    behind: current.id,
                };
                if let Some(p) = self.paths.get_mut(i) {
                    p.hold = Some(hold);
                }
                self.generation += 1;
                return;
            }
        }
        self.transition(i, PathState::Active { since: now }, "probe ok".into(), now);
    }

    /// Rules that depend on the whole set, run after every change: a held path is released
    /// when the path it waited behind stops carrying I/O, and when no path carries I/O any
    /// more, every logged-in path that could is made Active at once.
    pub(super) fn settle(&mut self, now: Instant) {
        for i in 0..self.paths.len() {
            let Some(behind) = self.paths.get(i).and_then(|p| p.hold).map(|h| h.behind) else {
                continue;
            };
            if !self.path(behind).is_some_and(Path::usable) {
                let reason = format!("failback: {behind} no longer active");
                self.transition(i, PathState::Active { since: now }, reason, now);
            }
        }
        if self.paths.iter().any(Path::usable) {
            return;
        }
        for i in 0..self.paths.len() {
            let rescue = self.paths.get(i).is_some_and(|p| {
                matches!(
                    p.state,
                    PathState::Probing { .. } | PathState::Demoted { .. }
                ) && p.tier < TIER_NO_IO
            });
            if rescue {
                self.transition(
                    i,
                    PathState::Active { since: now },
                    "no other path usable".into(),
                    now,
                );
            }
        }
    }

    /// Moves path `i` to `state`: resets what the new state starts afresh, records the change
    /// in its history and emits exactly one `StateChanged`.
    pub(super) fn transition(&mut self, i: usize, state: PathState, reason: String, now: Instant) {
        self.saw(now);
        let config = &self.config;
        let Some(p) = self.paths.get_mut(i) else {
            return;
        };
        let from = p.state.name();
        let was_logged_in = p.state.is_logged_in();
        p.hold = None;
        match &state {
            PathState::Connecting | PathState::Removed => {
                p.next_ping = None;
                p.reconnect_at = None;
            }
            PathState::Failed { .. } => {
                p.next_ping = None;
                p.reconnect_at = Some(now + config.reconnect_interval);
                p.p50 = None;
            }
            PathState::Probing { .. } | PathState::Active { .. } if !was_logged_in => {
                // A fresh connection: a probing path is pinged at once, an active one after
                // the usual interval.
                let first = match state {
                    PathState::Probing { .. } => now,
                    _ => now + config.ping_interval,
                };
                p.next_ping = Some(first);
                p.reconnect_at = None;
                p.last_contact = Some(now);
                p.ping_outstanding = false;
                p.misses = 0;
                p.p50 = None;
            }
            _ => {}
        }
        p.slow_samples = 0;
        p.state = state;
        let to = p.state.name();
        Self::record(p, now, to, reason.clone());
        self.events.push_back(Event::StateChanged {
            path: p.id,
            from,
            to,
            reason,
        });
        self.generation += 1;
    }

    pub(super) fn saw(&mut self, now: Instant) {
        self.last_now = Some(self.last_now.map_or(now, |t| t.max(now)));
    }

    pub(super) fn record(p: &mut Path, now: Instant, state: &'static str, reason: String) {
        if p.history.len() >= HISTORY_LEN {
            p.history.remove(0);
        }
        p.history.push((now, state, reason));
    }
}
