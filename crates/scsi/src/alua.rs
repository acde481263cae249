//! ALUA target port groups (SPC-4 5.15): per-group access state shared by every LU of a target.
//!
//! States are atomics so the per-command check is one load. Every change bumps a generation
//! counter; each LU compares it with the last one it saw and raises ASYMMETRIC ACCESS STATE
//! CHANGED on all its nexuses when it moves.
//!
//! Groups of other servers that export the same logical units (the other gateways of a shared
//! RBD image) are *remote*: REPORT TARGET PORT GROUPS lists them with the states those
//! servers publish, so every path reports the same states. No command runs through a remote
//! group here; their list is read only by REPORT TARGET PORT GROUPS.

use crate::sense::{key, Sense};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Asymmetric access state of a target port group (SPC-4 table 167).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AluaState {
    /// Active/optimized.
    ActiveOptimized = 0,
    /// Active/non-optimized.
    ActiveNonOptimized = 1,
    /// Standby.
    Standby = 2,
    /// Unavailable.
    Unavailable = 3,
    /// Transitioning between states.
    Transitioning = 0xF,
}

impl AluaState {
    /// Decodes the 4-bit state code.
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::ActiveOptimized,
            1 => Self::ActiveNonOptimized,
            2 => Self::Standby,
            3 => Self::Unavailable,
            0xF => Self::Transitioning,
            _ => return None,
        })
    }
}

/// One target port group.
#[derive(Debug)]
pub struct PortGroup {
    /// Target port group identifier.
    pub id: u16,
    /// Relative target port identifiers in this group.
    pub ports: Vec<u16>,
    state: AtomicU8,
}

impl PortGroup {
    /// Current state.
    pub fn state(&self) -> AluaState {
        AluaState::from_code(self.state.load(Ordering::Acquire)).unwrap_or(AluaState::Unavailable)
    }
}

/// The port groups of one target.
#[derive(Debug)]
pub struct TargetPortGroups {
    groups: Vec<PortGroup>,
    /// Other servers' groups, `(id, state)` in id order; each holds relative target port `id`.
    remote: RwLock<Vec<(u16, AluaState)>>,
    generation: AtomicU64,
}

impl TargetPortGroups {
    /// Groups given as `(group id, relative target port ids)`; all start active/optimized.
    pub fn new(groups: impl IntoIterator<Item = (u16, Vec<u16>)>) -> Self {
        let groups = groups
            .into_iter()
            .map(|(id, ports)| PortGroup {
                id,
                ports,
                state: AtomicU8::new(AluaState::ActiveOptimized as u8),
            })
            .collect();
        Self {
            groups,
            remote: RwLock::new(Vec::new()),
            generation: AtomicU64::new(0),
        }
    }

    /// One group per portal group tag `1..=n`, each holding relative target port `n`.
    pub fn one_per_port(n: u16) -> Self {
        Self::new((1..=n).map(|i| (i, vec![i])))
    }

    /// All groups.
    pub fn groups(&self) -> &[PortGroup] {
        &self.groups
    }

    /// Changes a group's state (implicit ALUA); returns `false` if the group does not exist.
    pub fn set_state(&self, group: u16, state: AluaState) -> bool {
        let Some(g) = self.groups.iter().find(|g| g.id == group) else {
            return false;
        };
        let old = g.state.swap(state as u8, Ordering::AcqRel);
        if old != state as u8 {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        true
    }

    /// State of a group (unknown groups count as active/optimized so a target without ALUA
    /// configuration works).
    pub fn state_of(&self, group: u16) -> AluaState {
        self.groups
            .iter()
            .find(|g| g.id == group)
            .map_or(AluaState::ActiveOptimized, PortGroup::state)
    }

    /// Takes the groups other servers publish now (`(id, state)`; ids of this server's own
    /// groups are ignored, and for an id given twice the least available state counts). A
    /// remote group seen before and missing now is unavailable: its server stopped, or was
    /// fenced and unpublished. Returns whether the state of a group already listed changed:
    /// then the generation moves, and every nexus gets ASYMMETRIC ACCESS STATE CHANGED. A
    /// group that appears is listed from then on without a unit attention (no path's access
    /// changed; a host reads the groups when it logs in to the new server).
    pub fn set_remote(&self, published: &[(u16, AluaState)]) -> bool {
        let mut next: Vec<(u16, AluaState)> = Vec::new();
        for &(id, state) in published {
            if self.groups.iter().any(|g| g.id == id) {
                continue;
            }
            match next.iter_mut().find(|(i, _)| *i == id) {
                Some(entry) if rank(state) > rank(entry.1) => entry.1 = state,
                Some(_) => {}
                None => next.push((id, state)),
            }
        }
        let mut remote = self.remote.write();
        for &(id, _) in remote.iter() {
            if !next.iter().any(|(i, _)| *i == id) {
                next.push((id, AluaState::Unavailable));
            }
        }
        next.sort_by_key(|(id, _)| *id);
        let changed = next
            .iter()
            .any(|(id, state)| remote.iter().any(|(i, old)| i == id && old != state));
        *remote = next;
        if changed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        changed
    }

    /// Other servers' groups as last taken by [`Self::set_remote`], in id order.
    pub fn remote(&self) -> Vec<(u16, AluaState)> {
        self.remote.read().clone()
    }

    /// Counter bumped on every state change.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// SPC-4 5.15.2.4: what a command gets through a port group in `state`, or `None` if allowed.
    pub(crate) fn access_check(state: AluaState, opcode: u8, action: u8) -> Option<Sense> {
        use crate::cdb::op;
        let always = matches!(
            opcode,
            op::INQUIRY
                | op::REPORT_LUNS
                | op::REQUEST_SENSE
                | op::MODE_SENSE_6
                | op::MODE_SENSE_10
        ) || (opcode == op::MAINTENANCE_IN && matches!(action, 0x0A | 0x0C | 0x0D))
            || (opcode == op::MAINTENANCE_OUT && action == 0x0A);
        match state {
            AluaState::ActiveOptimized | AluaState::ActiveNonOptimized => None,
            _ if always => None,
            AluaState::Standby
                if matches!(
                    opcode,
                    op::TEST_UNIT_READY
                        | op::MODE_SELECT_6
                        | op::MODE_SELECT_10
                        | op::PERSISTENT_RESERVE_IN
                        | op::PERSISTENT_RESERVE_OUT
                        | op::RECEIVE_COPY_RESULTS
                ) || (opcode == op::SERVICE_ACTION_IN_16 && action == 0x10) =>
            {
                None
            }
            AluaState::Standby => Some(Sense::new(key::NOT_READY, 0x04, 0x0B)),
            AluaState::Unavailable => Some(Sense::new(key::NOT_READY, 0x04, 0x0C)),
            AluaState::Transitioning => Some(Sense::new(key::NOT_READY, 0x04, 0x0A)),
        }
    }
}

/// How far a state is from serving I/O, for merging two reports of one group.
fn rank(state: AluaState) -> u8 {
    match state {
        AluaState::ActiveOptimized => 0,
        AluaState::ActiveNonOptimized => 1,
        AluaState::Standby => 2,
        AluaState::Transitioning => 3,
        AluaState::Unavailable => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_changes_bump_generation() {
        let t = TargetPortGroups::one_per_port(2);
        assert_eq!(t.generation(), 0);
        assert!(t.set_state(2, AluaState::Standby));
        assert!(!t.set_state(9, AluaState::Standby));
        assert_eq!(t.generation(), 1);
        t.set_state(2, AluaState::Standby);
        assert_eq!(t.generation(), 1);
        assert_eq!(t.state_of(2), AluaState::Standby);
        assert!(TargetPortGroups::access_check(AluaState::Standby, 0x28, 0).is_some());
        assert!(TargetPortGroups::access_check(AluaState::Standby, 0x12, 0).is_none());
    }

    #[test]
    fn remote_groups_follow_what_is_published_and_vanished_ones_go_unavailable() {
        use AluaState::*;
        let t = TargetPortGroups::one_per_port(1);
        // Another server's group 2 and 3 appear (no unit attention: no path's access changed);
        // our own group 1 is never taken from others.
        let g = t.generation();
        assert!(!t.set_remote(&[(3, ActiveOptimized), (1, Standby), (2, ActiveOptimized)]));
        assert_eq!(t.remote(), vec![(2, ActiveOptimized), (3, ActiveOptimized)]);
        assert_eq!(t.state_of(1), ActiveOptimized);
        assert_eq!(t.generation(), g);
        assert!(!t.set_remote(&[(2, ActiveOptimized), (3, ActiveOptimized)]));
        assert_eq!(t.generation(), g);
        // Two reports of one group: the less available one counts.
        assert!(t.set_remote(&[(2, ActiveOptimized), (2, Standby), (3, ActiveOptimized)]));
        assert_eq!(t.remote(), vec![(2, Standby), (3, ActiveOptimized)]);
        // Group 3's server is gone from the published list: unavailable, not forgotten.
        assert!(t.set_remote(&[(2, ActiveOptimized)]));
        assert_eq!(t.remote(), vec![(2, ActiveOptimized), (3, Unavailable)]);
        assert!(t.generation() > g);
        // It comes back.
        assert!(t.set_remote(&[(2, ActiveOptimized), (3, ActiveOptimized)]));
        assert_eq!(t.remote(), vec![(2, ActiveOptimized), (3, ActiveOptimized)]);
    }
}
