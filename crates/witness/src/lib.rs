//! The HA pair's witness: who may acknowledge writes alone, decided by a transaction in etcd.
//!
//! Two nodes replicate every write synchronously. When one loses the other, it stops
//! acknowledging and races for the epoch here: the replication core's `race_proposal` turns the
//! record it read into the one it wants (epoch + 1, itself the holder, the other outdated), and
//! a compare-and-swap on the key's revision stores it. Exactly one write on a revision
//! succeeds, so at most one node acknowledges alone in any epoch, without waiting for a lease
//! to expire: failover is bounded by detection and one etcd round trip. A node marked outdated
//! never wins. After a resync the sync source clears the marks (`in_sync_proposal`).
//!
//! etcd is reached through its v3 JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`, served by
//! etcd 3.4 on the client port), so building lanes needs no protobuf compiler. The parts:
//! [`record`] (the stored JSON), [`http`] (a sans-IO HTTP/1.1 exchange), [`gateway`] (the JSON
//! of range and txn), and [`Witness`] (the tokio client).

pub mod gateway;
pub mod http;
pub mod record;

mod client;

pub use client::{Versioned, Witness, WitnessConfig};
pub use record::NodeId;
pub use replication::{EpochRecord, RaceOutcome};

/// Why a witness operation did not complete.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No endpoint answered within the timeout; the caller must assume nothing changed.
    #[error("etcd unreachable ({endpoints}): {reason}")]
    Unreachable { endpoints: String, reason: String },
    /// An endpoint answered something that is not etcd's JSON gateway.
    #[error("etcd at {endpoint} answered badly: {reason}")]
    Protocol { endpoint: String, reason: String },
    /// The epoch key holds a value lanes did not write.
    #[error("the epoch key {key} holds an unreadable value: {reason}")]
    Record { key: String, reason: String },
}
