//! The life cycle of one path ([`PathState`]), driven by [`PathSet`](crate::PathSet).
//!
//! ```text
//!     add()
//!       |
//!       v
//!  +------------+  login_failed    +----------+   Reconnect every reconnect_interval;
//!  | Connecting |----------------->|  Failed  |   a failed re-login stays Failed
//!  +------------+                  +----------+
//!       |                            |      ^
//!       | logged_in       logged_in  |      |  ping_misses pings unanswered, command_timeout
//!       | (first login)              v      |  or connection_lost, from Probing, Active or
//!       |                      +-----------+  Demoted; emits Event::Fail
//!       |                      |  Probing  |<-------------------+
//!       |                      +-----------+                    |
//!       |   probe_successes pings  |                            | demote_for elapsed
//!       |   answered (failover:    |                            |
//!       |   and the failback gate) |                      +-----------+
//!       v                          v                      |  Demoted  |
//!  +--------------------------------------+               +-----------+
//!  |                Active                |---------------------^
//!  +--------------------------------------+   p50 slow in 2 samples in a row, or
//!                                             errors >= error_threshold in one;
//!                                             never the last usable path
//!
//!  Probing, Demoted ---- no path usable any more ----> Active   ("no other path usable")
//!  any ---- remove() ----> Removed
//! ```
//!
//! Only `Active` paths carry I/O. `Probing` and `Demoted` paths are logged in and pinged but get
//! no new commands; `Failed` paths have no connection and are re-logged-in on `Reconnect`.
//!
//! The first login goes straight to `Active`: it proved the path, and the device should be usable
//! at once. A re-login goes through `Probing`, because a path that just failed should show it
//! stays up before taking I/O again. Under the failover policy with failback `manual` or a delay,
//! a recovered path that would take over from the current one stays in `Probing` after its probe
//! until the gate opens, or until the current path stops carrying I/O.
//!
//! Every transition emits exactly one `Event::StateChanged` and is recorded in the path's
//! history with its time and reason; an ALUA tier change does the same within its state.

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
