//! Health configuration, the per-tick sample the driver feeds in, and the events it drains.

use std::fmt;
use std::time::Duration;

use crate::path::PathId;
use crate::policy::Failback;

/// Timers and thresholds of path health. `Default` gives the values in the field docs.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthConfig {
    /// 250 ms: a NOP-Out per logged-in path this often.
    pub ping_interval: Duration,
    /// 3: this many consecutive unanswered pings fail the path.
    pub ping_misses: u32,
    /// 5 s: a command outstanding this long fails the path.
    pub command_timeout: Duration,
    /// 500 ms between re-login attempts of a failed path.
    pub reconnect_interval: Duration,
    /// 2 answered pings after a re-login before the path is Active again.
    pub probe_successes: u32,
    /// 8.0: demote when a path's p50 latency is above this many times the best other active
    /// path's, for 2 samples in a row...
    pub latency_factor: f64,
    /// 20 ms: ... and above this absolute floor.
    pub latency_floor: Duration,
    /// 5: this many errors in one sample demote the path (0 = never).
    pub error_threshold: u32,
    /// 5 s in Demoted before the path is probed again.
    pub demote_for: Duration,
    /// When a recovered path may take over again (failover policy only).
    pub failback: Failback,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            ping_interval: Duration::from_millis(250),
            ping_misses: 3,
            command_timeout: Duration::from_secs(5),
            reconnect_interval: Duration::from_millis(500),
            probe_successes: 2,
            latency_factor: 8.0,
            latency_floor: Duration::from_millis(20),
            error_threshold: 5,
            demote_for: Duration::from_secs(5),
            failback: Failback::Immediate,
        }
    }
}

/// Per-tick counters of one path: deltas since the previous sample of that path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathSample {
    /// Commands completed in this tick.
    pub completed: u64,
    /// Bytes moved by them.
    pub bytes: u64,
    /// Commands that ended in a transport or SCSI error in this tick.
    pub errors: u64,
    /// Latency percentiles of this tick's completions (ignored when `completed` is 0).
    pub latency_p50: Duration,
    pub latency_p99: Duration,
    /// Age of the oldest command still outstanding on the path.
    pub oldest_inflight: Option<Duration>,
}

/// What the driver must do, drained with [`PathSet::poll_event`](crate::PathSet::poll_event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Send a NOP-Out on this path now and report `ping_sent` / `ping_answered`.
    SendPing(PathId),
    /// Kill the path's connection (abortive close), fence it, and replay its in-flight commands
    /// on other paths. Comes with the `StateChanged` to Failed.
    Fail { path: PathId, reason: String },
    /// Try logging in again; report `logged_in` or `login_failed`. Repeats every
    /// `reconnect_interval` while the path is Failed, so a driver with a login still under way
    /// should ignore it.
    Reconnect(PathId),
    /// The path changed state (or ALUA tier); log it once.
    StateChanged {
        path: PathId,
        from: &'static str,
        to: &'static str,
        reason: String,
    },
}

/// A duration written for people: "850 µs", "3.5 ms", "120 ms", "5 s", "1.5 s".
pub(crate) struct Human(pub Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = self.0.as_micros();
        if micros < 1_000 {
            write!(f, "{micros} µs")
        } else if micros < 10_000 {
            write!(f, "{} ms", trim(micros as f64 / 1e3))
        } else if micros < 1_000_000 {
            write!(f, "{} ms", micros / 1_000)
        } else {
            write!(f, "{} s", trim(self.0.as_secs_f64()))
        }
    }
}

/// One decimal, without a trailing ".0".
fn trim(x: f64) -> String {
    let s = format!("{x:.1}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        let cases = [
            (Duration::from_micros(850), "850 µs"),
            (Duration::from_micros(3_500), "3.5 ms"),
            (Duration::from_millis(3), "3 ms"),
            (Duration::from_millis(120), "120 ms"),
            (Duration::from_secs(5), "5 s"),
            (Duration::from_millis(1_540), "1.5 s"),
        ];
        for (d, s) in cases {
            assert_eq!(Human(d).to_string(), s);
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = HealthConfig::default();
        assert_eq!(c.ping_interval, Duration::from_millis(250));
        assert_eq!(
            (c.ping_misses, c.probe_successes, c.error_threshold),
            (3, 2, 5)
        );
        assert_eq!(c.failback, Failback::Immediate);
    }
}
