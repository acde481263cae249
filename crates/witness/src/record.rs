//! The epoch record kept under the cluster's key, and its two transitions.

use serde::{Deserialize, Serialize};

/// A node of the pair: 1 or 2.
pub type NodeId = u8;

/// Whether both nodes hold every acknowledged write, or one acknowledges alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum ClusterState {
    /// Both replicas current; writes are acknowledged only when applied on both.
    InSync,
    /// `holder` acknowledges alone; the other node is outdated until it has resynced.
    Alone { holder: NodeId },
}

/// The value of the epoch key (JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    pub epoch: u64,
    #[serde(flatten)]
    pub state: ClusterState,
}

/// Why a transition is not allowed from a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("node {me} is outdated: node {holder} acknowledges alone in epoch {epoch}")]
    Outdated {
        me: NodeId,
        holder: NodeId,
        epoch: u64,
    },
    #[error("node {me} does not hold epoch {epoch}, so it cannot end it")]
    NotHolder { me: NodeId, epoch: u64 },
}

impl EpochRecord {
    /// The record a new cluster starts from.
    pub const FIRST: EpochRecord = EpochRecord {
        epoch: 1,
        state: ClusterState::InSync,
    };

    /// The node that is outdated, if any.
    pub fn outdated(&self) -> Option<NodeId> {
        match self.state {
            ClusterState::InSync => None,
            ClusterState::Alone { holder } => Some(if holder == 1 { 2 } else { 1 }),
        }
    }

    /// `me` lost its peer and wants to acknowledge alone. From `InSync` that is a new epoch
    /// held by `me`; a holder keeps its epoch; an outdated node is refused.
    pub fn claim(&self, me: NodeId) -> Result<EpochRecord, Refused> {
        match self.state {
            ClusterState::InSync => Ok(EpochRecord {
                epoch: self.epoch + 1,
                state: ClusterState::Alone { holder: me },
            }),
            ClusterState::Alone { holder } if holder == me => Ok(*self),
            ClusterState::Alone { holder } => Err(Refused::Outdated {
                me,
                holder,
                epoch: self.epoch,
            }),
        }
    }

    /// The holder has resynced its peer: both acknowledge together again, in a new epoch.
    pub fn rejoin(&self, me: NodeId) -> Result<EpochRecord, Refused> {
        match self.state {
            ClusterState::Alone { holder } if holder == me => Ok(EpochRecord {
                epoch: self.epoch + 1,
                state: ClusterState::InSync,
            }),
            _ => Err(Refused::NotHolder {
                me,
                epoch: self.epoch,
            }),
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let record: EpochRecord = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        match record.state {
            ClusterState::Alone { holder } if holder != 1 && holder != 2 => {
                Err(format!("holder {holder} is not node 1 or 2"))
            }
            _ if record.epoch == 0 => Err("epoch 0".to_string()),
            _ => Ok(record),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_from_in_sync_starts_an_epoch_and_outdates_the_other() {
        let won = EpochRecord::FIRST.claim(2).unwrap();
        assert_eq!(won.epoch, 2);
        assert_eq!(won.state, ClusterState::Alone { holder: 2 });
        assert_eq!(won.outdated(), Some(1));
        // The holder keeps its epoch; the outdated node cannot take it.
        assert_eq!(won.claim(2), Ok(won));
        assert_eq!(
            won.claim(1),
            Err(Refused::Outdated {
                me: 1,
                holder: 2,
                epoch: 2
            })
        );
    }

    #[test]
    fn only_the_holder_rejoins() {
        let alone = EpochRecord::FIRST.claim(1).unwrap();
        assert!(alone.rejoin(2).is_err());
        let back = alone.rejoin(1).unwrap();
        assert_eq!(back.epoch, 3);
        assert_eq!(back.state, ClusterState::InSync);
        assert_eq!(back.outdated(), None);
        assert!(back.rejoin(1).is_err());
    }

    #[test]
    fn json_round_trips_and_rejects_what_lanes_never_writes() {
        for r in [EpochRecord::FIRST, EpochRecord::FIRST.claim(2).unwrap()] {
            assert_eq!(EpochRecord::from_json(&r.to_json()), Ok(r));
        }
        assert_eq!(
            String::from_utf8(EpochRecord::FIRST.claim(1).unwrap().to_json()).unwrap(),
            r#"{"epoch":2,"state":"alone","holder":1}"#
        );
        for bad in [
            &br#"{"epoch":2,"state":"alone","holder":3}"#[..],
            br#"{"epoch":0,"state":"in-sync"}"#,
            br#"{"epoch":2,"state":"split"}"#,
            b"hello",
            b"",
        ] {
            assert!(EpochRecord::from_json(bad).is_err(), "{bad:?}");
        }
    }
}
