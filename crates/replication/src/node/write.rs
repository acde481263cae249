//! The write path and the ordering of overlapping writes.
//!
//! # Overlap rule
//!
//! Each node applies overlapping operations locally in one order: the order in which it
//! *admitted* them (`Op::order`). An own write is admitted (and, when paired, sent) in one step,
//! once its activity-log extents are durable; a peer write is admitted when it arrives. An
//! operation starts its local I/O only when every earlier-admitted overlapping one is done, so
//! local application is FIFO per overlap.
//!
//! Every replicated write carries `seen`: the highest peer write sequence number its origin had
//! received when sending it. For two overlapping writes X (from the leader) and Y (from the
//! follower) this makes their relation known to both nodes alike: X before Y if `Y.seen >=
//! X.wseq`, Y before X if `X.seen >= Y.wseq`, concurrent otherwise (each node applied its own
//! first). Causal pairs are applied in causal order on both nodes by the FIFO rule. For a
//! concurrent pair the leader's write wins: the follower applies X after Y anyway (FIFO), and
//! the leader, which already applied X, refuses Y — `Superseded` when X (with any other
//! concurrent leader writes) covers Y entirely, `Retry` otherwise (and always for FUA, whose
//! data must be durable as written). A retried Y is admitted again as a new write with a fresh
//! sequence number and `seen`, so it comes after X on both nodes.
//!
//! Why the leader sees every concurrent pair: a write is retired only when the peer's
//! acknowledgement has been *handled*, and an acknowledgement carries a `fence` (the sender's
//! last sent write), handled only once every write up to the fence has arrived. The follower
//! sent Y before it received X (concurrent), so before it acknowledged X; the leader therefore
//! receives Y while X is still in flight. Sequence numbers reject duplicated messages, and the
//! two channels may reorder freely against each other: the fence covers exactly that. So the
//! leader's sequence of applied writes is the follower's with the refused writes left out, and
//! every refused write is overwritten later in the follower's sequence (by the covering leader
//! writes, or by its own retry): both end the same. COMPARE AND WRITE (executed by the leader
//! for both nodes) adds three rules to this one: see `node/caw.rs`.

use bytes::Bytes;

use super::ops::{CawStage, Kind, Op, PeerSide, Phase};
use super::{Link, Replica, State};
use crate::action::{Action, HostError, WriteId};
use crate::al::Acquire;
use crate::config::Nanos;
use crate::meta::MetaOp;
use crate::wire::{Body, Write, WriteAck, WriteStatus};

/// How own writes are handled in the current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Replicate,
    Local,
    Hold,
    Reject(HostError),
}

impl Replica {
    pub(super) fn write_mode(&self) -> Mode {
        match (&self.state, &self.link) {
            (State::Paired { .. } | State::ResyncSource { .. }, Link::Up) => Mode::Replicate,
            (State::Alone { .. }, _) => Mode::Local,
            (State::Suspended { serving: true, .. }, Link::Down) => Mode::Hold,
            (State::Outdated, _) => Mode::Reject(HostError::Fenced),
            _ => Mode::Reject(HostError::NotReady),
        }
    }

    /// A host write of `blocks` blocks at `lba`; `data` is `blocks * block_size` bytes (a cheap
    /// reference-counted handle: the core never copies it).
    pub fn submit_write(
        &mut self,
        now: Nanos,
        id: WriteId,
        lba: u64,
        blocks: u32,
        fua: bool,
        data: Bytes,
    ) {
        let (e0, e1) = self.al.extents(lba, blocks);
        let valid = blocks > 0
            && lba
                .checked_add(u64::from(blocks))
                .is_some_and(|end| end <= self.cfg.lun_blocks)
            && data.len() as u64 == u64::from(blocks) * u64::from(self.cfg.block_size)
            && ((e1 - e0) as usize) < self.al.capacity();
        let result = if !valid {
            Err(HostError::Invalid)
        } else if let Mode::Reject(e) = self.write_mode() {
            Err(e)
        } else if self.host_writes >= self.cfg.max_inflight {
            Err(HostError::Busy)
        } else {
            Ok(())
        };
        if let Err(e) = result {
            self.actions
                .push_back(Action::AckWrite { id, result: Err(e) });
            return;
        }
        let op = Op::new(Kind::Own { id }, lba, blocks, fua, data, self.session);
        match self.ops.insert(op) {
            Some(slot) => {
                self.host_writes += 1;
                self.unadmitted.push_back(slot);
                self.pump(now);
            }
            None => self.actions.push_back(Action::AckWrite {
                id,
                result: Err(HostError::Busy),
            }),
        }
    }

    /// Take the activity-log extents of `slot`; true once they are durable.
    fn al_ready(&mut self, slot: u32) -> bool {
        let Some(op) = self.ops.get(slot) else {
            return false;
        };
        if let Some(token) = op.al {
            return token <= self.persisted;
        }
        let (e0, e1) = self.al.extents(op.lba, op.blocks);
        let own = matches!(op.kind, Kind::Own { .. });
        let (journal, actions) = (&mut self.journal, &mut self.actions);
        let outcome = self.al.acquire(e0, e1, own, |slot, extent| {
            *journal += 1;
            actions.push_back(Action::Persist {
                token: *journal,
                op: MetaOp::AlSet {
                    slot,
                    extent: Some(extent),
                },
            });
            *journal
        });
        match outcome {
            Acquire::Held { token } => {
                if let Some(op) = self.ops.get_mut(slot) {
                    op.al = Some(token);
                }
                token <= self.persisted
            }
            Acquire::NeedSync => {
                self.request_al_sync();
                false
            }
            Acquire::Busy => false,
        }
    }

    /// Admit own writes whose extents are durable, in submission order where possible.
    pub(super) fn admit_own(&mut self) {
        for _ in 0..self.unadmitted.len() {
            let Some(slot) = self.unadmitted.pop_front() else {
                break;
            };
            if !self.try_admit(slot) {
                self.unadmitted.push_back(slot);
            }
        }
    }

    fn try_admit(&mut self, slot: u32) -> bool {
        let mode = self.write_mode();
        if self.caw_orphaned(slot) {
            self.free(slot);
            return true;
        }
        if let Mode::Reject(e) = mode {
            self.fail_own(slot, e);
            return true;
        }
        let caw = self.ops.get(slot).is_some_and(|o| o.caw.is_some());
        if caw && mode == Mode::Hold {
            // Executed by the race's winner (see `node/caw.rs`).
            return false;
        }
        if caw && mode == Mode::Replicate && !self.leads() {
            self.fail_own(slot, HostError::NotReady);
            return true;
        }
        if !self.al_ready(slot) {
            return false;
        }
        let Some(op) = self.ops.get(slot) else {
            return true;
        };
        let (lba, end) = (op.lba, op.end());
        // A resync read in flight over these blocks (data or checksums) must be sent before
        // this write is; so must the write of a CAW ordered before it (whose read has not
        // compared yet).
        let blocked = self.set.overlapping(lba, end).any(|o| {
            self.ops.get(o).is_some_and(|o| {
                matches!(o.kind, Kind::ResyncRead | Kind::ResyncSum)
                    || o.caw_stage() == Some(CawStage::Compare)
            })
        });
        if blocked {
            return false;
        }
        let order = self.next_order;
        self.next_order += 1;
        self.set.insert(lba, end, slot);
        let Some(op) = self.ops.get_mut(slot) else {
            return true;
        };
        op.order = order;
        op.phase = Phase::Waiting;
        op.retry = false;
        self.ops.note_waiting(slot);
        if !caw {
            // A CAW is sent (or marked dirty) once its read has compared.
            self.dispatch_own(slot, mode);
        }
        true
    }

    /// An own write's turn to leave: sent to the peer (`Replicate`), or, working alone or
    /// holding writes, its blocks marked dirty. Plain writes go at admission, a CAW's write
    /// once its read compared equal.
    pub(super) fn dispatch_own(&mut self, slot: u32, mode: Mode) {
        let (seen, wseq) = (self.last_peer_wseq, self.next_wseq);
        let Some(op) = self.ops.get_mut(slot) else {
            return;
        };
        let (lba, blocks) = (op.lba, op.blocks);
        match mode {
            Mode::Replicate => {
                op.wseq = wseq;
                op.peer = PeerSide::Sent;
                let body = Body::Write(Write {
                    wseq,
                    seen,
                    lba,
                    blocks,
                    fua: op.fua,
                    data: op.data.clone(),
                });
                self.next_wseq += 1;
                self.last_sent_wseq = wseq;
                self.send(body);
            }
            Mode::Local | Mode::Hold => {
                op.peer = if mode == Mode::Local {
                    PeerSide::Local
                } else {
                    PeerSide::Held
                };
                self.mark_dirty(lba, blocks);
            }
            Mode::Reject(_) => {}
        }
    }

    /// Start the local I/O of admitted operations whose turn it is, in slot order. Only slots
    /// noted as waiting are visited ([`super::ops::Slab::next_noted`]): a pass used to look at
    /// every slot after every input, the core's largest cost under load.
    pub(super) fn start_ready(&mut self) {
        let mut cursor = 0;
        while let Some(slot) = self.ops.next_noted(cursor) {
            cursor = slot + 1;
            if self
                .ops
                .get(slot)
                .is_none_or(|op| op.phase != Phase::Waiting)
            {
                self.ops.clear_note(slot);
                continue;
            }
            if self.ops.get(slot).is_some_and(|op| op.needs_al()) && !self.al_ready(slot) {
                continue;
            }
            let Some(op) = self.ops.get(slot) else {
                continue;
            };
            let (order, lba, end) = (op.order, op.lba, op.end());
            let earlier = self.set.overlapping(lba, end).any(|o| {
                self.ops.get(o).is_some_and(|o| {
                    o.order < order && o.phase != Phase::Done && o.phase != Phase::Unadmitted
                })
            });
            if earlier {
                continue;
            }
            if op.caw_stage() == Some(CawStage::Compare)
                || matches!(op.kind, Kind::Forwarded { .. })
            {
                self.start_caw(slot);
                continue;
            }
            if let Kind::Superseded { wseq } = op.kind {
                if op.session == self.session && self.link == Link::Up {
                    let fence = self.last_sent_wseq;
                    self.send(Body::WriteAck(WriteAck {
                        wseq,
                        status: WriteStatus::Superseded,
                        fence,
                    }));
                }
                self.free(slot);
                continue;
            }
            let token = self.ops.token(slot);
            let Some(op) = self.ops.get_mut(slot) else {
                continue;
            };
            op.phase = Phase::Running;
            let action = if op.is_resync_read() {
                Action::ReadForResync {
                    token,
                    lba: op.lba,
                    blocks: op.blocks,
                    sums: op.kind != Kind::ResyncRead,
                }
            } else {
                Action::Apply {
                    token,
                    lba: op.lba,
                    blocks: op.blocks,
                    fua: op.fua,
                    data: op.data.clone(),
                }
            };
            self.actions.push_back(action);
        }
    }

    /// A local apply finished.
    pub fn apply_done(&mut self, now: Nanos, token: u64) {
        let Some(slot) = self.ops.slot_of(token) else {
            return;
        };
        let Some(op) = self.ops.get_mut(slot) else {
            return;
        };
        if op.phase != Phase::Running || op.is_resync_read() {
            return;
        }
        self.applied += 1;
        op.phase = Phase::Done;
        let (kind, lba, blocks, session, retry) =
            (op.kind, op.lba, op.blocks, op.session, op.retry);
        op.applied_at = self.applied;
        // An own write keeps its extents until the peer has it too or its regions are dirty
        // (journaled before any later eviction): until then a crash here must find it in the
        // activity log.
        let covered = !matches!(kind, Kind::Own { .. })
            || matches!(op.peer, PeerSide::Held | PeerSide::Local);
        if covered && op.al.take().is_some() {
            let (e0, e1) = self.al.extents(lba, blocks);
            self.al
                .release(e0, e1, self.applied, matches!(kind, Kind::Own { .. }));
        }
        let current = session == self.session && self.link == Link::Up;
        match kind {
            Kind::Own { .. } if retry => self.readmit(slot),
            Kind::Own { .. } => self.maybe_finish_own(slot),
            Kind::Peer { wseq } => {
                if current {
                    let fence = self.last_sent_wseq;
                    self.send(Body::WriteAck(WriteAck {
                        wseq,
                        status: WriteStatus::Applied,
                        fence,
                    }));
                }
                self.free(slot);
            }
            Kind::ResyncApply => {
                self.stats.resync_applied_blocks += u64::from(blocks);
                self.resync_moved = now;
                if current {
                    self.send(Body::ResyncAck(crate::wire::ResyncAck { lba, blocks }));
                }
                self.free(slot);
            }
            Kind::ResyncRead
            | Kind::ResyncSum
            | Kind::ResyncCompare
            | Kind::Superseded { .. }
            | Kind::Forwarded { .. } => {}
        }
        self.pump(now);
    }

    /// The peer asked for `slot` again: order it anew (after what the peer sent before).
    fn readmit(&mut self, slot: u32) {
        let Some(op) = self.ops.get_mut(slot) else {
            return;
        };
        let lba = op.lba;
        op.phase = Phase::Unadmitted;
        op.peer = PeerSide::None;
        op.retry = false;
        self.set.remove(lba, slot);
        self.unadmitted.push_front(slot);
    }

    /// Acknowledge and retire an own write whose local and peer sides are complete.
    pub(super) fn maybe_finish_own(&mut self, slot: u32) {
        let Some(op) = self.ops.get(slot) else { return };
        let Kind::Own { id } = op.kind else { return };
        if op.phase != Phase::Done {
            return;
        }
        if op.host_done {
            self.free(slot);
            return;
        }
        let complete = match op.peer {
            PeerSide::Acked => true,
            PeerSide::Local => self.persisted >= self.alone_token,
            _ => false,
        };
        if !complete {
            return;
        }
        if op.caw.is_some() {
            let outcome = self.caw_outcome(slot);
            self.caw_answer(slot, Ok(outcome));
        } else if !op.host_done {
            self.actions
                .push_back(Action::AckWrite { id, result: Ok(()) });
        }
        self.free(slot);
    }

    /// Fail an own write to the host; it is retired once its local I/O (if any) is done.
    pub(super) fn fail_own(&mut self, slot: u32, e: HostError) {
        if self.ops.get(slot).is_some_and(|o| o.caw.is_some()) {
            self.caw_answer(slot, Err(e));
        }
        let Some(op) = self.ops.get_mut(slot) else {
            return;
        };
        let Kind::Own { id } = op.kind else { return };
        if !op.host_done {
            op.host_done = true;
            self.actions
                .push_back(Action::AckWrite { id, result: Err(e) });
        }
        op.peer = PeerSide::None;
        op.retry = false;
        if matches!(op.phase, Phase::Unadmitted | Phase::Done) {
            self.free(slot);
        }
    }

    pub(super) fn free(&mut self, slot: u32) {
        let Some(op) = self.ops.remove(slot) else {
            return;
        };
        if op.phase != Phase::Unadmitted {
            self.set.remove(op.lba, slot);
        } else {
            self.unadmitted.retain(|&s| s != slot);
        }
        if op.al.is_some() {
            let (e0, e1) = self.al.extents(op.lba, op.blocks);
            self.al
                .release(e0, e1, op.applied_at, matches!(op.kind, Kind::Own { .. }));
        }
        if op.is_host() {
            self.host_writes -= 1;
        }
    }

    /// A replicated write from the peer.
    pub(super) fn on_write(&mut self, now: Nanos, w: Write) {
        let receiving = matches!(
            self.state,
            State::Paired { .. } | State::ResyncTarget { .. }
        );
        if !receiving || self.link != Link::Up {
            self.refuse("Write", "not receiving writes");
            return;
        }
        let valid = w.blocks > 0
            && w.lba
                .checked_add(u64::from(w.blocks))
                .is_some_and(|end| end <= self.cfg.lun_blocks)
            && w.data.len() as u64 == u64::from(w.blocks) * u64::from(self.cfg.block_size)
            && {
                let (e0, e1) = self.al.extents(w.lba, w.blocks);
                ((e1 - e0) as usize) < self.al.capacity()
            };
        if !valid {
            self.refuse_and_drop(now, "Write", "malformed");
            return;
        }
        if w.wseq <= self.last_peer_wseq {
            self.stats.duplicates += 1;
            self.refuse("Write", "old write sequence");
            return;
        }
        self.last_peer_wseq = w.wseq;
        let leader = matches!(self.state, State::Paired { leader } if leader == self.cfg.node);
        let end = w.lba + u64::from(w.blocks);
        let mut status = WriteStatus::Applied;
        if leader {
            // Concurrent own writes overlapping it (sent after the peer last heard from us).
            // A CAW's write never supersedes: its read did not see this write.
            self.scratch.clear();
            let mut caw = false;
            for o in self.set.overlapping(w.lba, end) {
                if let Some(op) = self.ops.get(o) {
                    let concurrent = matches!(op.kind, Kind::Own { .. })
                        && matches!(op.peer, PeerSide::Sent | PeerSide::Acked)
                        && w.seen < op.wseq;
                    if concurrent {
                        self.scratch.push((op.lba.max(w.lba), op.end().min(end)));
                    }
                    caw |= op.caw_stage() == Some(CawStage::Compare)
                        || (concurrent && op.caw.is_some());
                }
            }
            if caw {
                status = WriteStatus::Retry;
            } else if !self.scratch.is_empty() {
                self.scratch.sort_unstable();
                let mut covered_to = w.lba;
                for &(s, e) in &self.scratch {
                    if s > covered_to {
                        break;
                    }
                    covered_to = covered_to.max(e);
                }
                status = if covered_to >= end && !w.fua {
                    WriteStatus::Superseded
                } else {
                    WriteStatus::Retry
                };
            }
        }
        if status == WriteStatus::Retry {
            self.stats.retried += 1;
            let fence = self.last_sent_wseq;
            self.send(Body::WriteAck(WriteAck {
                wseq: w.wseq,
                status,
                fence,
            }));
        } else {
            let kind = if status == WriteStatus::Superseded {
                self.stats.superseded += 1;
                Kind::Superseded { wseq: w.wseq }
            } else {
                Kind::Peer { wseq: w.wseq }
            };
            let op = Op::new(kind, w.lba, w.blocks, w.fua, w.data, self.session);
            let Some(slot) = self.ops.insert(op) else {
                self.refuse_and_drop(now, "Write", "too many writes in flight");
                return;
            };
            self.admit_other(slot);
        }
        self.drain_acks();
        self.pump(now);
    }

    /// Order a peer write or a resync operation now.
    pub(super) fn admit_other(&mut self, slot: u32) {
        let order = self.next_order;
        self.next_order += 1;
        if let Some(op) = self.ops.get_mut(slot) {
            op.order = order;
            op.phase = Phase::Waiting;
            let (lba, end) = (op.lba, op.end());
            self.set.insert(lba, end, slot);
            self.ops.note_waiting(slot);
        }
    }

    /// An acknowledgement of one of our writes: handled once its fence has arrived.
    pub(super) fn on_write_ack(&mut self, now: Nanos, ack: WriteAck) {
        if !matches!(
            self.state,
            State::Paired { .. } | State::ResyncSource { .. }
        ) {
            self.refuse("WriteAck", "not replicating");
            return;
        }
        if ack.fence > self.last_peer_wseq || !self.acks_waiting.is_empty() {
            self.acks_waiting.push_back(ack);
            return;
        }
        self.handle_ack(ack);
        self.pump(now);
    }

    fn drain_acks(&mut self) {
        while self
            .acks_waiting
            .front()
            .is_some_and(|a| a.fence <= self.last_peer_wseq)
        {
            if let Some(a) = self.acks_waiting.pop_front() {
                self.handle_ack(a);
            }
        }
    }

    fn handle_ack(&mut self, ack: WriteAck) {
        let found = self.ops.occupied().find(|&s| {
            self.ops.get(s).is_some_and(|o| {
                matches!(o.kind, Kind::Own { .. }) && o.peer == PeerSide::Sent && o.wseq == ack.wseq
            })
        });
        let Some(slot) = found else {
            self.refuse("WriteAck", "unknown write");
            return;
        };
        let Some(op) = self.ops.get_mut(slot) else {
            return;
        };
        match ack.status {
            WriteStatus::Applied | WriteStatus::Superseded => {
                op.peer = PeerSide::Acked;
                self.maybe_finish_own(slot);
            }
            WriteStatus::Retry => {
                if op.phase == Phase::Done {
                    self.readmit(slot);
                } else {
                    op.retry = true;
                }
            }
        }
    }
}
