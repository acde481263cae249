//! The life cycle of one path ([`PathState`]), driven by [`PathSet`](crate::PathSet).
//!
//! ```text
//!              add()
//!                |
//!                v
//!         +------------+   login_failed                   +----------+
//!         | Connecting |--------------------------------->|  Failed  |<-----------+
//!         +------------+                                  +----------+            |
//!                |                                         |  ^   |  Reconnect    |
//!                | logged_in (first login)       logged_in |  |   +-> every       |
//!                |                                         v  |       reconnect_  |
//!                |                                  +-----------+     interval    |
//!                |                                  |  Probing  |                 |
//!                |                                  +-----------+                 |
//!                |      probe_successes answered pings |    ^                     |
//!                |      (failover: + failback gate)    |    | demote_for elapsed  |
//!                v                                     v    |                     |
//!         +--------------------------------------------+  +-----------+           |
//!         |                   Active                   |->|  Demoted  |           |
//!         +--------------------------------------------+  +-----------+           |
//!              slow p50 for 2 samples, or errors >= threshold  (not the last usable path)
//!
//!   Probing, Active, Demoted --- ping_misses pings unanswered, command_timeout exceeded,
//!                                connection_lost ----------------------------> Failed (+ Fail)
//!   Probing, Demoted --- no Active path usable any more -------------------> Active
//!   any --- remove() ---> Removed
//! ```
//!
//! Only `Active` paths carry I/O. `Probing` and `Demoted` paths are logged in and pinged but get
//! no new commands; `Failed` paths have no connection and are re-logged-in on `Reconnect`.

use std::time::Instant;

/// Where one path is in its life cycle; each variant carries what that state needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathState {
    /// First login in progress.
    Connecting,
    /// Logged in (again); counting answered pings before carrying I/O. Under the failover policy
    /// a path that has passed its probe may wait here for failback (see
    /// [`PathSet::failback_pending`](crate::PathSet::failback_pending)).
    Probing { since: Instant, good: u32 },
    /// Carrying I/O (subject to ALUA tier and the round-robin subset).
    Active { since: Instant },
    /// Still logged in and pinged, but too slow or erroring: no new I/O until re-probed.
    Demoted { since: Instant, reason: String },
    /// Connection gone; the driver re-logs-in on `Event::Reconnect`.
    Failed { since: Instant, reason: String },
    /// Taken out of the set for good.
    Removed,
}

impl PathState {
    /// Lower-case name for logs, events and status output.
    pub fn name(&self) -> &'static str {
        match self {
            PathState::Connecting => "connecting",
            PathState::Probing { .. } => "probing",
            PathState::Active { .. } => "active",
            PathState::Demoted { .. } => "demoted",
            PathState::Failed { .. } => "failed",
            PathState::Removed => "removed",
        }
    }

    /// Logged in, so pinged and subject to command timeouts.
    pub fn is_logged_in(&self) -> bool {
        matches!(
            self,
            PathState::Probing { .. } | PathState::Active { .. } | PathState::Demoted { .. }
        )
    }

    /// When the current state began, where the state records it.
    pub fn since(&self) -> Option<Instant> {
        match self {
            PathState::Probing { since, .. }
            | PathState::Active { since }
            | PathState::Demoted { since, .. }
            | PathState::Failed { since, .. } => Some(*since),
            PathState::Connecting | PathState::Removed => None,
        }
    }
}

impl std::fmt::Display for PathState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathState::Demoted { reason, .. } | PathState::Failed { reason, .. } => {
                write!(f, "{} ({reason})", self.name())
            }
            _ => f.write_str(self.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_display() {
        let t = Instant::now();
        assert_eq!(PathState::Connecting.to_string(), "connecting");
        assert_eq!(PathState::Probing { since: t, good: 1 }.name(), "probing");
        assert_eq!(PathState::Active { since: t }.since(), Some(t));
        let failed = PathState::Failed {
            since: t,
            reason: "3 pings unanswered".into(),
        };
        assert_eq!(failed.to_string(), "failed (3 pings unanswered)");
        assert!(!failed.is_logged_in());
        assert!(PathState::Demoted {
            since: t,
            reason: String::new()
        }
        .is_logged_in());
        assert_eq!(PathState::Removed.since(), None);
    }
}
