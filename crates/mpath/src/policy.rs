//! Path policies and failback modes, with the names the command line uses for them.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How requests are spread over the eligible paths. Every policy first restricts itself to the
/// best ALUA tier among the eligible paths.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    /// `service-time` (default): the path with the least (inflight bytes + request bytes) /
    /// throughput, i.e. the one expected to finish this request first.
    #[default]
    ServiceTime,
    /// `queue-length`: the path with the fewest commands outstanding.
    QueueLength,
    /// `round-robin`: each eligible path in turn.
    RoundRobin,
    /// `round-robin-subset` or `round-robin-subset:N`: round robin over the first `active`
    /// healthy paths by id (default 2); the rest stand by and are promoted when an active one
    /// fails.
    RoundRobinSubset {
        /// Size of the active set (at least 1).
        active: usize,
    },
    /// `weighted`: requests in proportion to each path's weight, interleaved.
    Weighted,
    /// `failover`: only the usable path of highest priority; others wait (see [`Failback`]).
    Failover,
}

/// Size of the active set of `round-robin-subset` when the name gives none.
pub const DEFAULT_SUBSET: usize = 2;

/// The names [`Policy`] parses, for help texts and error messages.
pub const POLICY_NAMES: &[&str] = &[
    "service-time",
    "queue-length",
    "round-robin",
    "round-robin-subset[:N]",
    "weighted",
    "failover",
];

/// A policy or failback name that is not one of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error(
        "unknown path policy {0:?} (expected service-time, queue-length, round-robin, \
         round-robin-subset[:N], weighted or failover)"
    )]
    Policy(String),
    #[error("bad round-robin-subset size {0:?} (expected a whole number of paths, at least 1)")]
    SubsetSize(String),
    #[error("bad failback {0:?} (expected immediate, manual or a delay in seconds such as 10)")]
    Failback(String),
}

impl FromStr for Policy {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, arg) = match s.split_once(':') {
            Some((name, arg)) => (name, Some(arg)),
            None => (s, None),
        };
        let policy = match name {
            "service-time" => Policy::ServiceTime,
            "queue-length" => Policy::QueueLength,
            "round-robin" => Policy::RoundRobin,
            "weighted" => Policy::Weighted,
            "failover" => Policy::Failover,
            "round-robin-subset" => {
                let active = match arg {
                    None => DEFAULT_SUBSET,
                    Some(n) => match n.parse::<usize>() {
                        Ok(n) if n >= 1 => n,
                        _ => return Err(ParseError::SubsetSize(n.to_string())),
                    },
                };
                return Ok(Policy::RoundRobinSubset { active });
            }
            _ => return Err(ParseError::Policy(s.to_string())),
        };
        // Only the subset policy takes an argument.
        match arg {
            None => Ok(policy),
            Some(_) => Err(ParseError::Policy(s.to_string())),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::ServiceTime => f.write_str("service-time"),
            Policy::QueueLength => f.write_str("queue-length"),
            Policy::RoundRobin => f.write_str("round-robin"),
            Policy::RoundRobinSubset { active } if *active == DEFAULT_SUBSET => {
                f.write_str("round-robin-subset")
            }
            Policy::RoundRobinSubset { active } => write!(f, "round-robin-subset:{active}"),
            Policy::Weighted => f.write_str("weighted"),
            Policy::Failover => f.write_str("failover"),
        }
    }
}

/// When a recovered path that would take over from the current one (failover policy only) is
/// allowed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Failback {
    /// `immediate` (default): as soon as it has passed its probe.
    #[default]
    Immediate,
    /// `manual`: only when [`PathSet::failback_now`](crate::PathSet::failback_now) is called.
    Manual,
    /// `<secs>`, e.g. `10`: this long after it passed its probe.
    After(Duration),
}

impl FromStr for Failback {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "immediate" => Ok(Failback::Immediate),
            "manual" => Ok(Failback::Manual),
            _ => match s.parse::<f64>() {
                Ok(secs) if (0.0..=1e9).contains(&secs) => {
                    Ok(Failback::After(Duration::from_secs_f64(secs)))
                }
                _ => Err(ParseError::Failback(s.to_string())),
            },
        }
    }
}

impl fmt::Display for Failback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failback::Immediate => f.write_str("immediate"),
            Failback::Manual => f.write_str("manual"),
            Failback::After(d) => write!(f, "{}", d.as_secs_f64()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_round_trip() {
        for p in [
            Policy::ServiceTime,
            Policy::QueueLength,
            Policy::RoundRobin,
            Policy::RoundRobinSubset { active: 2 },
            Policy::RoundRobinSubset { active: 3 },
            Policy::Weighted,
            Policy::Failover,
        ] {
            assert_eq!(p.to_string().parse::<Policy>(), Ok(p.clone()), "{p}");
        }
        assert_eq!(Policy::default(), Policy::ServiceTime);
        assert_eq!(
            "round-robin-subset".parse(),
            Ok(Policy::RoundRobinSubset { active: 2 })
        );
        assert_eq!(
            "round-robin-subset:4".parse(),
            Ok(Policy::RoundRobinSubset { active: 4 })
        );
    }

    #[test]
    fn policy_errors() {
        assert!(matches!(
            "fastest".parse::<Policy>(),
            Err(ParseError::Policy(_))
        ));
        assert!(matches!(
            "round-robin:2".parse::<Policy>(),
            Err(ParseError::Policy(_))
        ));
        assert!(matches!(
            "round-robin-subset:0".parse::<Policy>(),
            Err(ParseError::SubsetSize(_))
        ));
        assert!(matches!(
            "round-robin-subset:x".parse::<Policy>(),
            Err(ParseError::SubsetSize(_))
        ));
        let msg = "ServiceTime".parse::<Policy>().unwrap_err().to_string();
        assert!(msg.contains("service-time"), "{msg}");
    }

    #[test]
    fn failback_names() {
        assert_eq!("immediate".parse(), Ok(Failback::Immediate));
        assert_eq!("manual".parse(), Ok(Failback::Manual));
        assert_eq!("10".parse(), Ok(Failback::After(Duration::from_secs(10))));
        assert_eq!(
            "0.5".parse(),
            Ok(Failback::After(Duration::from_millis(500)))
        );
        assert_eq!(Failback::After(Duration::from_secs(10)).to_string(), "10");
        assert_eq!(Failback::default(), Failback::Immediate);
        for bad in ["-1", "soon", "", "inf", "NaN"] {
            assert!(bad.parse::<Failback>().is_err(), "{bad}");
        }
    }
}
