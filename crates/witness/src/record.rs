//! The epoch record as stored under the cluster's key: JSON of the replication core's
//! [`EpochRecord`] (`{"epoch":N,"holder":0|1|null,"outdated":0|1|null}`). Which transitions are
//! allowed is the core's decision (`replication::epoch`); this module only stores it.

use replication::EpochRecord;
use serde::{Deserialize, Serialize};

/// A node of the pair: 0 or 1 (the core's numbering; configuration says node 1 and 2).
pub type NodeId = replication::wire::NodeId;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    epoch: u64,
    holder: Option<NodeId>,
    outdated: Option<NodeId>,
}

pub fn to_json(record: &EpochRecord) -> Vec<u8> {
    serde_json::to_vec(&Stored {
        epoch: record.epoch,
        holder: record.holder,
        outdated: record.outdated,
    })
    .unwrap_or_default()
}

pub fn from_json(bytes: &[u8]) -> Result<EpochRecord, String> {
    let s: Stored = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    for (what, node) in [("holder", s.holder), ("outdated", s.outdated)] {
        if node.is_some_and(|n| n > 1) {
            return Err(format!("{what} {node:?} is not node 0 or 1"));
        }
    }
    if s.holder.is_some() && s.holder == s.outdated {
        return Err("the holder is also outdated".to_string());
    }
    Ok(EpochRecord {
        epoch: s.epoch,
        holder: s.holder,
        outdated: s.outdated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trips_and_rejects_what_lanes_never_writes() {
        let alone = EpochRecord {
            epoch: 7,
            holder: Some(1),
            outdated: Some(0),
        };
        for r in [EpochRecord::default(), alone] {
            assert_eq!(from_json(&to_json(&r)), Ok(r));
        }
        assert_eq!(
            String::from_utf8(to_json(&alone)).unwrap(),
            r#"{"epoch":7,"holder":1,"outdated":0}"#
        );
        for bad in [
            &br#"{"epoch":2,"holder":2,"outdated":null}"#[..],
            br#"{"epoch":2,"holder":1,"outdated":1}"#,
            br#"{"epoch":2,"holder":null,"outdated":null,"x":1}"#,
            b"hello",
            b"",
        ] {
            assert!(from_json(bad).is_err(), "{bad:?}");
        }
    }
}
