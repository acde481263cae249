//! What the core asks the driver to do, and what it reports.

use bytes::Bytes;

use crate::meta::MetaOp;
use crate::wire::{Channel, Message};

/// A host write's identifier, chosen by the driver (unique among its writes in flight).
pub type WriteId = u64;

/// Identifies one local I/O (apply, read for resync, fsync) or journal write; the driver hands
/// it back on completion.
pub type Token = u64;

/// ALUA access state for this node's target port groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alua {
    ActiveOptimized,
    Transitioning,
    Unavailable,
}

/// Why a host request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("this node does not serve I/O now")]
    NotReady,
    #[error("this node lost the epoch; the write may be undone by resync")]
    Fenced,
    #[error("too many writes in flight")]
    Busy,
    #[error("request out of range or malformed")]
    Invalid,
    #[error("aborted before it started")]
    Aborted,
    /// A COMPARE AND WRITE forwarded to the peer, which was lost before its answer came: it
    /// may or may not have written.
    #[error("the peer was lost before the outcome was known")]
    Indeterminate,
}

/// How a COMPARE AND WRITE ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CawOutcome {
    /// The data matched and the new data is written (on both nodes, or on this one alone while
    /// it holds the epoch).
    Written,
    /// The data differed first at this byte of the range; nothing was written.
    Miscompare(u64),
}

/// Which host writes an abort covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortScope {
    /// ABORT TASK.
    Task(WriteId),
    /// LUN RESET, PREEMPT AND ABORT, CLEAR TASK SET: every write in flight.
    All,
}

/// How a change of the shared SCSI state ([`crate::wire::Shared`]) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedOutcome {
    /// Installed on both nodes (or on this one alone, holding the epoch): the version now.
    Stored(u64),
    /// Not installed: the state moved on first (a change from the peer); load and redo it.
    Conflict,
}

/// Something the core observed, for logs and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A peer message was refused (stale epoch, duplicate, malformed or unexpected).
    Refused {
        message: &'static str,
        reason: &'static str,
        /// The core closes the connection for it (the driver should say so loudly).
        drops_link: bool,
    },
    /// Nothing came from the peer for the failure timeout: the core closes the connection.
    PeerSilent,
    /// A resync moved nothing for `Config::resync_stall`: the core closes the connection (the
    /// next handshake starts it again). `inflight` says what every operation waited for.
    ResyncStalled { inflight: String },
    /// The peer is lost (connection down or heartbeats missed).
    PeerLost,
    /// The state changed.
    State(&'static str),
    /// The handshake found no safe way to pair (both outdated, or both wrote alone).
    SplitBrain,
}

/// An output of the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send on the peer link.
    Send { channel: Channel, message: Message },
    /// Close the peer connection (both channels); the driver reconnects and then calls
    /// `peer_connected`. Nothing from the old connection may be delivered after this.
    DropPeerConnection,
    /// Write blocks locally; with `fua`, durable before completion. Call `apply_done(token)`.
    Apply {
        token: Token,
        lba: u64,
        blocks: u32,
        fua: bool,
        data: Bytes,
    },
    /// Read blocks locally for resync; call `resync_read_done(token, data)` with the blocks,
    /// or with `sums`, with their [`crate::node::block_sums`] (computed off the core's task).
    ReadForResync {
        token: Token,
        lba: u64,
        blocks: u32,
        sums: bool,
    },
    /// Read blocks locally for a COMPARE AND WRITE; call `caw_read_done(token, data)`.
    ReadForCaw { token: Token, lba: u64, blocks: u32 },
    /// Make every completed local write durable; call `fsync_done(token)`.
    Fsync { token: Token },
    /// Append to the metadata journal; call `meta_persisted(token)` once this entry and all
    /// before it are durable.
    Persist { token: Token, op: MetaOp },
    /// Complete a host write.
    AckWrite {
        id: WriteId,
        result: Result<(), HostError>,
    },
    /// Complete a host COMPARE AND WRITE (`submit_caw`).
    CawDone {
        id: WriteId,
        result: Result<CawOutcome, HostError>,
    },
    /// Complete a host SYNCHRONIZE CACHE.
    AckFlush {
        id: u64,
        result: Result<(), HostError>,
    },
    /// Answer a task-management abort: every write it covers is applied on both nodes (or
    /// was failed to the host).
    AbortDone { id: u64 },
    /// Race for the epoch in the store (see [`crate::epoch::race_proposal`]); call
    /// `race_result`.
    RaceForEpoch,
    /// Clear the peer's outdated mark in the store if the record is still at `epoch` (see
    /// [`crate::epoch::in_sync_proposal`]); call `in_sync_result`.
    MarkInSync { epoch: u64 },
    /// Set this node's target port groups' ALUA state.
    SetAlua(Alua),
    /// The local copy of the shared SCSI state changed (a change of either node, or the sync
    /// source's snapshot): persist it and hand it to the SCSI layer. Carried out before the
    /// acknowledgement that follows it is sent.
    SharedInstalled { version: u64, payload: Bytes },
    /// The peer's unit attentions for this node's I_T nexuses.
    SharedNotice { payload: Bytes },
    /// Complete a `submit_shared` or `submit_notice` call.
    SharedDone {
        id: u64,
        result: Result<SharedOutcome, HostError>,
    },
    /// Resync progress: regions still to copy (sync source only).
    ResyncProgress { remaining: u64 },
    /// For logs and counters.
    Event(Event),
}
