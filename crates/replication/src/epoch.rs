//! The epoch record in the external store (etcd) and the two transactions on it.
//!
//! The store holds one record per LUN under a key whose revision serves as the compare value.
//! The driver runs the transactions (read, decide with the functions here, compare-and-swap on
//! the revision, re-read on conflict) and reports the outcome to the core.

use crate::wire::NodeId;

/// The record under the epoch key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EpochRecord {
    pub epoch: u64,
    /// The node that won the epoch, if it is alone.
    pub holder: Option<NodeId>,
    /// A node that must not serve until resynced.
    pub outdated: Option<NodeId>,
}

/// How a race for the epoch ended (input to the core).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaceOutcome {
    /// This node holds `epoch` alone; the peer is marked outdated.
    Won { epoch: u64 },
    /// The other node won (or this node is marked outdated).
    Lost { epoch: u64 },
    /// The store did not answer.
    Unreachable,
}

/// The record `me` writes to win a race from `current`, or None if `me` may not win (it is
/// marked outdated). The write must be a compare-and-swap on the revision read with `current`;
/// if it fails, re-read and decide again.
pub fn race_proposal(current: &EpochRecord, me: NodeId) -> Option<EpochRecord> {
    if current.outdated == Some(me) {
        return None;
    }
    Some(EpochRecord {
        epoch: current.epoch + 1,
        holder: Some(me),
        outdated: Some(1 - me),
    })
}

/// The record the sync source writes after a finished resync in `epoch`, so that either node
/// may win a later race: None if there is nothing to change, or if the record has moved on
/// (a request delayed past a later race must not clear that race's outdated mark). The mark
/// may name either node: a handshake in the same epoch proved both hold the same data.
pub fn in_sync_proposal(current: &EpochRecord, me: NodeId, epoch: u64) -> Option<EpochRecord> {
    let _ = me;
    if current.epoch == epoch && (current.holder.is_some() || current.outdated.is_some()) {
        Some(EpochRecord {
            epoch: current.epoch,
            holder: None,
            outdated: None,
        })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_winner_per_revision() {
        let r = EpochRecord {
            epoch: 4,
            holder: None,
            outdated: None,
        };
        let a = race_proposal(&r, 0).unwrap();
        assert_eq!(
            a,
            EpochRecord {
                epoch: 5,
                holder: Some(0),
                outdated: Some(1)
            }
        );
        // The other node, re-reading after its compare failed, may not win.
        assert_eq!(race_proposal(&a, 1), None);
        // The winner may race again (a later loss of the peer) and stays the holder.
        assert_eq!(race_proposal(&a, 0).unwrap().epoch, 6);
        assert_eq!(
            in_sync_proposal(&a, 0, 5),
            Some(EpochRecord {
                epoch: 5,
                holder: None,
                outdated: None
            })
        );
        // The target may clear it too (both hold the same data once resynced).
        assert_eq!(in_sync_proposal(&a, 1, 5).map(|r| r.outdated), Some(None));
        // A stale request from before a later race changes nothing.
        assert_eq!(in_sync_proposal(&a, 0, 4), None);
    }
}
