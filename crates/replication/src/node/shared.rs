//! Shared SCSI state (persistent reservations) and unit-attention notices between the nodes.
//!
//! The core carries the state as opaque bytes with a version both nodes agree on; what the
//! bytes mean is the SCSI layer's business. A change made on a node is installed on both
//! before it completes:
//!
//! ```text
//! submit_shared(base, state) ── Paired ──▶ Shared{Change, base} ──▶ peer: version == base?
//!                                                                     ├ yes: install, ack ✓
//!        SharedDone(Stored(base + 1)) ◀── install here ◀── SharedAck ─┘ no:  ack ✗ ─▶ Conflict
//! ```
//!
//! - Two changes made at once on both nodes from the same base: the leader of the pair (the
//!   one that orders concurrent writes, the sync source while resyncing) refuses the
//!   follower's, the follower takes the leader's; the follower's change ends `Conflict` and
//!   its SCSI layer redoes it on the new state. So both nodes install the same sequence.
//! - Peer lost with a change in flight: like a write, it is held while the epoch race runs;
//!   the winner installs it alone and completes it, the loser fails it (`Fenced`). A node
//!   that holds the epoch alone installs changes at once.
//! - Every handshake ends with the sync source sending its state (`Snapshot`); the target
//!   takes it whatever it held, so a returning node takes the survivor's reservations.
//! - Notices (unit attentions for the peer's I_T nexuses) are acknowledged once raised there;
//!   without a peer they complete at once (a returning node's nexuses log in again and get
//!   their power-on unit attention anyway).

use bytes::Bytes;

use super::ops::PeerSide;
use super::{Link, Replica, State};
use crate::action::{Action, HostError, SharedOutcome};
use crate::config::Nanos;
use crate::wire::{Body, NodeId, Shared, SharedAck, SharedKind};

/// A change or notice of this node's in flight.
#[derive(Debug, Clone)]
pub(super) struct SharedOp {
    id: u64,
    /// Our id on the wire.
    wire: u64,
    notice: bool,
    base: u64,
    payload: Bytes,
    peer: PeerSide,
}

/// This node's copy of the shared state and its changes in flight.
#[derive(Debug, Default)]
pub(super) struct SharedState {
    version: u64,
    payload: Bytes,
    ops: Vec<SharedOp>,
    next_wire: u64,
}

impl Replica {
    /// The shared state this node starts with (read from its own persistent copy), before any
    /// peer connection.
    pub fn set_shared(&mut self, version: u64, payload: Bytes) {
        self.shared.version = version;
        self.shared.payload = payload;
    }

    /// This node's copy of the shared state and its version.
    pub fn shared(&self) -> (u64, &Bytes) {
        (self.shared.version, &self.shared.payload)
    }

    /// Replace the shared state at version `base` with `payload`, on both nodes before
    /// `Action::SharedDone { id }` reports `Stored`.
    pub fn submit_shared(&mut self, now: Nanos, id: u64, base: u64, payload: Bytes) {
        self.submit_shared_op(now, id, false, base, payload);
    }

    /// Unit attentions for the peer's I_T nexuses; `SharedDone { id }` once raised there (or
    /// at once without a peer).
    pub fn submit_notice(&mut self, now: Nanos, id: u64, payload: Bytes) {
        self.submit_shared_op(now, id, true, 0, payload);
    }

    fn submit_shared_op(&mut self, now: Nanos, id: u64, notice: bool, base: u64, payload: Bytes) {
        let peer = match self.write_mode() {
            super::write::Mode::Replicate => PeerSide::Sent,
            super::write::Mode::Local => PeerSide::Local,
            super::write::Mode::Hold if !notice => PeerSide::Held,
            super::write::Mode::Hold => PeerSide::Local,
            super::write::Mode::Reject(_) if notice => PeerSide::Local,
            super::write::Mode::Reject(e) => {
                self.shared_done(id, Err(e));
                return;
            }
        };
        if !notice && base != self.shared.version {
            self.shared_done(id, Ok(SharedOutcome::Conflict));
            return;
        }
        let op = SharedOp {
            id,
            wire: self.shared.next_wire + 1,
            notice,
            base,
            payload,
            peer,
        };
        self.shared.next_wire += 1;
        match peer {
            PeerSide::Sent => {
                self.send(Body::Shared(Shared {
                    id: op.wire,
                    kind: if notice {
                        SharedKind::Notice
                    } else {
                        SharedKind::Change
                    },
                    base,
                    payload: op.payload.clone(),
                }));
                self.shared.ops.push(op);
            }
            PeerSide::Held => self.shared.ops.push(op),
            _ => self.commit_shared(op),
        }
        let _ = now;
    }

    fn shared_done(&mut self, id: u64, result: Result<SharedOutcome, HostError>) {
        self.actions.push_back(Action::SharedDone { id, result });
    }

    /// Installs `op` here (the peer has it, or this node goes on alone) and completes it.
    fn commit_shared(&mut self, op: SharedOp) {
        if op.notice {
            self.shared_done(op.id, Ok(SharedOutcome::Stored(self.shared.version)));
            return;
        }
        if op.base != self.shared.version {
            self.shared_done(op.id, Ok(SharedOutcome::Conflict));
            return;
        }
        self.install_shared(op.base.wrapping_add(1), op.payload);
        self.shared_done(op.id, Ok(SharedOutcome::Stored(self.shared.version)));
    }

    fn install_shared(&mut self, version: u64, payload: Bytes) {
        self.shared.version = version;
        self.shared.payload = payload.clone();
        self.actions
            .push_back(Action::SharedInstalled { version, payload });
    }

    /// Which node orders concurrent changes: the same one that orders concurrent writes.
    fn shared_leader(&self) -> Option<NodeId> {
        match self.state {
            State::Paired { leader } | State::ResyncTarget { leader } => Some(leader),
            State::ResyncSource { .. } => Some(self.cfg.node),
            _ => None,
        }
    }

    pub(super) fn on_shared(&mut self, now: Nanos, m: Shared) {
        match m.kind {
            SharedKind::Snapshot => {
                // Only a sync target takes the source's state as it is.
                if !matches!(self.state, State::ResyncTarget { .. }) {
                    self.refuse("Shared", "snapshot while not a sync target");
                    return;
                }
                self.install_shared(m.base, m.payload);
            }
            SharedKind::Notice => {
                self.actions
                    .push_back(Action::SharedNotice { payload: m.payload });
                self.send(Body::SharedAck(SharedAck {
                    id: m.id,
                    accepted: true,
                }));
            }
            SharedKind::Change => {
                let leader = self.shared_leader();
                let mine_first = leader == Some(self.cfg.node)
                    && self
                        .shared
                        .ops
                        .iter()
                        .any(|o| !o.notice && o.base == m.base && o.peer == PeerSide::Sent);
                let accepted = leader.is_some() && m.base == self.shared.version && !mine_first;
                if accepted {
                    self.install_shared(m.base.wrapping_add(1), m.payload);
                }
                self.send(Body::SharedAck(SharedAck { id: m.id, accepted }));
            }
        }
        let _ = now;
    }

    pub(super) fn on_shared_ack(&mut self, now: Nanos, a: SharedAck) {
        let Some(i) = self
            .shared
            .ops
            .iter()
            .position(|o| o.wire == a.id && o.peer == PeerSide::Sent)
        else {
            self.refuse("SharedAck", "unknown change");
            return;
        };
        let op = self.shared.ops.remove(i);
        if a.accepted {
            self.commit_shared(op);
        } else {
            self.shared_done(op.id, Ok(SharedOutcome::Conflict));
        }
        let _ = now;
    }

    /// The handshake made this node the sync source: the peer takes its state.
    pub(super) fn send_shared_snapshot(&mut self) {
        if self.link == Link::Up {
            self.send(Body::Shared(Shared {
                id: 0,
                kind: SharedKind::Snapshot,
                base: self.shared.version,
                payload: self.shared.payload.clone(),
            }));
        }
    }

    /// The peer is lost: changes in flight are held (`Held`), installed alone (`Local`) or
    /// failed (`fail`); notices complete.
    pub(super) fn shared_peer_lost(&mut self, side: PeerSide, fail: bool) {
        let ops = std::mem::take(&mut self.shared.ops);
        for mut op in ops {
            if !matches!(op.peer, PeerSide::Sent | PeerSide::Held) {
                self.shared.ops.push(op);
            } else if op.notice {
                self.commit_shared(op);
            } else if fail {
                self.shared_done(op.id, Err(HostError::Fenced));
            } else if side == PeerSide::Local {
                self.commit_shared(op);
            } else {
                op.peer = side;
                self.shared.ops.push(op);
            }
        }
    }

    /// Held changes complete: installed alone (the race is won).
    pub(super) fn shared_release_held(&mut self) {
        let ops = std::mem::take(&mut self.shared.ops);
        for op in ops {
            if op.peer == PeerSide::Held {
                self.commit_shared(op);
            } else {
                self.shared.ops.push(op);
            }
        }
    }

    /// Held changes fail: this node is fenced (or about to be overwritten by a resync).
    pub(super) fn shared_fail_held(&mut self) {
        let ops = std::mem::take(&mut self.shared.ops);
        for op in ops {
            if op.peer == PeerSide::Held {
                self.shared_done(op.id, Err(HostError::Fenced));
            } else {
                self.shared.ops.push(op);
            }
        }
    }
}

#[cfg(test)]
mod tests;
