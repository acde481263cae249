//! Path identity and the plain-number view of a path that the selector reads on every request.

use std::fmt;

/// Identifies one path (one connection to one portal) within a [`PathSet`](crate::PathSet).
///
/// Ids are handed out by [`PathSet::add`](crate::PathSet::add) in increasing order and never
/// reused, so an id seen in an old event can never name a newer path.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct PathId(pub u32);

impl fmt::Display for PathId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "path{}", self.0)
    }
}

/// ALUA active/optimized: the preferred tier.
pub const TIER_OPTIMIZED: u8 = 0;
/// ALUA active/non-optimized: used only when no optimized path is eligible.
pub const TIER_NON_OPTIMIZED: u8 = 1;
/// ALUA standby, unavailable, offline or transitioning: never used for I/O. Any tier at or above
/// this value means the same.
pub const TIER_NO_IO: u8 = 2;

/// Short name of an ALUA tier, for logs and `StateChanged` events.
pub fn tier_name(tier: u8) -> &'static str {
    match tier {
        TIER_OPTIMIZED => "active/optimized",
        TIER_NON_OPTIMIZED => "active/non-optimized",
        _ => "no-io",
    }
}

/// What the selector sees of one path: plain numbers the driver copies out of its per-path atomic
/// counters, so that choosing a path needs no lock and no allocation.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct PathView {
    /// [`PathSet::eligible`](crate::PathSet::eligible) said I/O may go here (state Active, not
    /// demoted, failback gate passed, inside the round-robin subset).
    pub eligible: bool,
    /// ALUA tier: [`TIER_OPTIMIZED`], [`TIER_NON_OPTIMIZED`], or [`TIER_NO_IO`] and above.
    pub tier: u8,
    /// Bytes of the commands outstanding on this path.
    pub inflight_bytes: u64,
    /// Number of commands outstanding on this path.
    pub inflight_cmds: u32,
    /// Throughput estimate in bytes/s; 0 = unknown (treated like the mean of the known ones).
    pub throughput: u64,
    /// Relative share for the weighted policy; 0 is treated as 1.
    pub weight: u32,
    /// Higher is preferred by the failover policy.
    pub priority: u32,
}

impl PathView {
    /// Whether the selector may consider this path at all.
    pub(crate) fn usable(&self) -> bool {
        self.eligible && self.tier < TIER_NO_IO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_tier_names() {
        assert_eq!(PathId(3).to_string(), "path3");
        assert_eq!(tier_name(0), "active/optimized");
        assert_eq!(tier_name(1), "active/non-optimized");
        assert_eq!(tier_name(2), "no-io");
        assert_eq!(tier_name(200), "no-io");
    }

    #[test]
    fn only_eligible_io_tiers_are_usable() {
        let v = PathView {
            eligible: true,
            tier: 1,
            ..PathView::default()
        };
        assert!(v.usable());
        assert!(!PathView { tier: 2, ..v }.usable());
        assert!(!PathView {
            eligible: false,
            ..v
        }
        .usable());
    }
}
