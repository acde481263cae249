//! COMPARE AND WRITE, atomic across both nodes.
//!
//! One node executes every CAW of the pair: the leader while paired (the node that wins
//! concurrent overlapping writes), the sync source while resyncing, the node that holds the
//! epoch alone. The follower forwards its hosts' CAWs (`Caw`) and waits for the answer
//! (`CawResult`).
//!
//! # Rule
//!
//! On the executing node a CAW is ordered like an own write (FIFO per overlap, after its
//! activity-log extents are durable), but is not sent when ordered: when its turn comes its
//! range is read (`Action::ReadForCaw`) and compared. On a mismatch it completes with the
//! offset and writes nothing. On a match its new data becomes an own write in the same place of
//! the order: sent to the peer then, and applied at once (nothing overlapping ordered after it
//! ran meanwhile). So on this node the read and the write are one step of the local sequence.
//!
//! What keeps that step one step on the other node too (`node/write.rs` has the proof for
//! plain writes; three things change):
//!
//! - While a CAW is ordered but not sent, an own write overlapping it is not admitted (it
//!   would be sent first, and the follower would apply it before the CAW's write, the leader
//!   after). It waits, like behind a resync read.
//! - A follower write that overlaps a CAW ordered but not sent, or one sent that it had not
//!   seen (concurrent), is refused `Retry`, never `Superseded`. The follower then orders it
//!   again after the CAW's write. `Superseded` would order it *before* the CAW's write while the
//!   CAW's read did not see it: the compare would have missed an acknowledged write.
//! - The leader's writes and its `CawResult` travel on the data channel, so the result reaches
//!   the follower after every write the leader had applied when it read. The follower orders
//!   the result there like a peer write and completes the CAW once everything ordered before it
//!   is applied: a read of the follower's host after the answer sees at least what the compare
//!   saw. A `Written` result is sent only after the follower acknowledged the CAW's write.
//!
//! # Without the peer
//!
//! A forwarded CAW whose answer has not come when the peer is lost may or may not have written
//! on the leader: it fails `Indeterminate` (the host retries). While the epoch race runs a CAW
//! waits unordered, like a held write; the winner executes it alone, the loser fails it. A CAW
//! this node was executing when the peer went completes like a write: its answer is held until
//! the race is won, failed if lost. A sync target refuses CAWs like writes.

use bytes::Bytes;

use super::ops::{CawOrigin, CawPart, CawStage, Kind, Op, PeerSide, Phase};
use super::write::Mode;
use super::{Link, Replica, State};
use crate::action::{Action, CawOutcome, HostError, WriteId};
use crate::config::Nanos;
use crate::wire::{Body, Caw, CawResult, CawStatus};

impl Replica {
    /// Whether this node executes the pair's CAWs while connected.
    pub(super) fn leads(&self) -> bool {
        match self.state {
            State::Paired { leader } => leader == self.cfg.node,
            State::ResyncSource { .. } => true,
            _ => false,
        }
    }

    fn caw_valid(&self, lba: u64, blocks: u32, verify: &Bytes, write: &Bytes) -> bool {
        let len = u64::from(blocks) * u64::from(self.cfg.block_size);
        let (e0, e1) = self.al.extents(lba, blocks);
        blocks > 0
            && lba
                .checked_add(u64::from(blocks))
                .is_some_and(|end| end <= self.cfg.lun_blocks)
            && verify.len() as u64 == len
            && write.len() as u64 == len
            && ((e1 - e0) as usize) < self.al.capacity()
    }

    /// A host COMPARE AND WRITE of `blocks` blocks at `lba`: if they hold `verify`, write
    /// `write` (both `blocks * block_size` bytes). Ends with `Action::CawDone { id }`; `id`
    /// shares the space of write ids.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_caw(
        &mut self,
        now: Nanos,
        id: WriteId,
        lba: u64,
        blocks: u32,
        fua: bool,
        verify: Bytes,
        write: Bytes,
    ) {
        let mode = self.write_mode();
        let result = if !self.caw_valid(lba, blocks, &verify, &write) {
            Err(HostError::Invalid)
        } else if let Mode::Reject(e) = mode {
            Err(e)
        } else if self.host_writes >= self.cfg.max_inflight {
            Err(HostError::Busy)
        } else {
            Ok(())
        };
        if let Err(e) = result {
            self.actions
                .push_back(Action::CawDone { id, result: Err(e) });
            return;
        }
        let forward = mode == Mode::Replicate && !self.leads();
        let kind = if forward {
            Kind::Forwarded { id }
        } else {
            Kind::Own { id }
        };
        let mut op = Op::new(kind, lba, blocks, fua, write, self.session);
        op.caw = Some(Box::new(CawPart {
            origin: CawOrigin::Host,
            verify,
            stage: CawStage::Compare,
        }));
        let Some(slot) = self.ops.insert(op) else {
            self.actions.push_back(Action::CawDone {
                id,
                result: Err(HostError::Busy),
            });
            return;
        };
        self.host_writes += 1;
        if forward {
            self.forward_caw(slot);
        } else {
            self.unadmitted.push_back(slot);
        }
        self.pump(now);
    }

    /// Send a host CAW to the leader; it stays unordered here until the result comes.
    fn forward_caw(&mut self, slot: u32) {
        self.stats.caws_forwarded += 1;
        self.next_caw += 1;
        let (wire, session) = (self.next_caw, self.session);
        let Some(op) = self.ops.get_mut(slot) else {
            return;
        };
        // A forwarded CAW is never sent as a write: its `wseq` is its wire id.
        op.wseq = wire;
        op.session = session;
        let Some(part) = op.caw.as_ref() else { return };
        let body = Body::Caw(Caw {
            id: wire,
            lba: op.lba,
            blocks: op.blocks,
            fua: op.fua,
            verify: part.verify.clone(),
            write: op.data.clone(),
        });
        self.send(body);
    }

    /// The leader: a CAW the follower forwarded.
    pub(super) fn on_caw(&mut self, now: Nanos, c: Caw) {
        if !self.caw_valid(c.lba, c.blocks, &c.verify, &c.write) {
            self.refuse_and_drop(now, "Caw", "malformed");
            return;
        }
        let refuse = |r: &mut Replica| {
            r.send(Body::CawResult(CawResult {
                id: c.id,
                status: CawStatus::Refused,
            }))
        };
        let leader = matches!(self.state, State::Paired { leader } if leader == self.cfg.node);
        if !leader || self.link != Link::Up {
            self.refuse("Caw", "not the leader");
            refuse(self);
            return;
        }
        let mut op = Op::new(
            Kind::Own { id: 0 },
            c.lba,
            c.blocks,
            c.fua,
            c.write,
            self.session,
        );
        op.caw = Some(Box::new(CawPart {
            origin: CawOrigin::Peer {
                wire: c.id,
                session: self.session,
            },
            verify: c.verify,
            stage: CawStage::Compare,
        }));
        match self.ops.insert(op) {
            Some(slot) => self.unadmitted.push_back(slot),
            None => refuse(self),
        }
        self.pump(now);
    }

    /// The follower: the leader's answer to a forwarded CAW.
    pub(super) fn on_caw_result(&mut self, now: Nanos, r: CawResult) {
        let session = self.session;
        let found = self.ops.occupied().find(|&s| {
            self.ops.get(s).is_some_and(|o| {
                matches!(o.kind, Kind::Forwarded { .. })
                    && o.phase == Phase::Unadmitted
                    && o.wseq == r.id
                    && o.session == session
            })
        });
        let Some(slot) = found else {
            self.refuse("CawResult", "unknown CAW");
            return;
        };
        let stage = match r.status {
            CawStatus::Written => CawStage::Write,
            CawStatus::Miscompare(i) => CawStage::Miscompare(i),
            CawStatus::Refused => {
                self.caw_answer(slot, Err(HostError::NotReady));
                self.free(slot);
                self.pump(now);
                return;
            }
        };
        if let Some(part) = self.ops.get_mut(slot).and_then(|o| o.caw.as_mut()) {
            part.stage = stage;
        }
        // Answered once every operation ordered here before the result is applied.
        self.admit_other(slot);
        self.pump(now);
    }

    /// Whether `slot` is a CAW forwarded by the peer on a connection that is gone (nobody
    /// waits for it: the follower failed it when it lost us).
    pub(super) fn caw_orphaned(&self, slot: u32) -> bool {
        self.ops.get(slot).is_some_and(|o| {
            matches!(
                o.caw.as_ref().map(|c| c.origin),
                Some(CawOrigin::Peer { session, .. })
                    if session != self.session || self.link != Link::Up
            )
        })
    }

    /// Its turn came: a CAW reads its range, a forwarded one is answered.
    pub(super) fn start_caw(&mut self, slot: u32) {
        let token = self.ops.token(slot);
        let Some(op) = self.ops.get_mut(slot) else {
            return;
        };
        if let Kind::Forwarded { .. } = op.kind {
            let result = match op.caw_stage() {
                Some(CawStage::Miscompare(i)) => Ok(CawOutcome::Miscompare(i)),
                _ => Ok(CawOutcome::Written),
            };
            self.caw_answer(slot, result);
            self.free(slot);
            return;
        }
        op.phase = Phase::Running;
        let (lba, blocks) = (op.lba, op.blocks);
        self.actions
            .push_back(Action::ReadForCaw { token, lba, blocks });
    }

    /// The local read of a CAW finished: compare, then write or answer.
    pub fn caw_read_done(&mut self, now: Nanos, token: u64, data: Bytes) {
        let Some(slot) = self.ops.slot_of(token) else {
            return;
        };
        let Some(op) = self.ops.get(slot) else { return };
        if op.phase != Phase::Running || op.caw_stage() != Some(CawStage::Compare) {
            return;
        }
        if self.caw_orphaned(slot) {
            self.free(slot);
            self.pump(now);
            return;
        }
        let Some(part) = op.caw.as_ref() else { return };
        // A short read is the driver's fault: compare nothing, write nothing.
        let short = data.len() != part.verify.len();
        let differs = data
            .iter()
            .zip(part.verify.iter())
            .position(|(a, b)| a != b);
        self.stats.caws += 1;
        let mode = self.write_mode();
        let leads = self.leads();
        let Some(op) = self.ops.get_mut(slot) else {
            return;
        };
        op.phase = Phase::Done;
        if short {
            self.fail_own(slot, HostError::NotReady);
            self.pump(now);
            return;
        }
        if let Some(i) = differs {
            if let Some(part) = op.caw.as_mut() {
                part.stage = CawStage::Miscompare(i as u64);
            }
            if mode == Mode::Hold {
                // Answered if this node wins the epoch race, failed if it loses.
                op.peer = PeerSide::Held;
            } else {
                self.caw_answer(slot, Ok(CawOutcome::Miscompare(i as u64)));
                self.free(slot);
            }
            self.pump(now);
            return;
        }
        if let Some(part) = op.caw.as_mut() {
            part.stage = CawStage::Write;
        }
        let (lba, blocks, fua) = (op.lba, op.blocks, op.fua);
        match mode {
            Mode::Replicate if leads => self.dispatch_own(slot, mode),
            Mode::Local | Mode::Hold => self.dispatch_own(slot, mode),
            Mode::Replicate => {
                self.fail_own(slot, HostError::NotReady);
                self.pump(now);
                return;
            }
            Mode::Reject(e) => {
                self.fail_own(slot, e);
                self.pump(now);
                return;
            }
        }
        let Some(op) = self.ops.get_mut(slot) else {
            return;
        };
        op.phase = Phase::Running;
        let data = op.data.clone();
        self.actions.push_back(Action::Apply {
            token,
            lba,
            blocks,
            fua,
            data,
        });
        self.pump(now);
    }

    /// Tell whoever waits for the CAW in `slot` how it ended (once).
    pub(super) fn caw_answer(&mut self, slot: u32, result: Result<CawOutcome, HostError>) {
        let (current, session) = (self.link == Link::Up, self.session);
        let Some(op) = self.ops.get_mut(slot) else {
            return;
        };
        if op.host_done {
            return;
        }
        op.host_done = true;
        let origin = op.caw.as_ref().map(|c| c.origin);
        match (op.kind, origin) {
            (Kind::Own { .. }, Some(CawOrigin::Peer { wire, session: s }))
                if current && s == session =>
            {
                let status = match result {
                    Ok(CawOutcome::Written) => CawStatus::Written,
                    Ok(CawOutcome::Miscompare(i)) => CawStatus::Miscompare(i),
                    Err(_) => CawStatus::Refused,
                };
                self.send(Body::CawResult(CawResult { id: wire, status }));
            }
            // Forwarded on a connection that is gone: nobody waits for it.
            (Kind::Own { .. }, Some(CawOrigin::Peer { .. })) => {}
            (Kind::Own { id } | Kind::Forwarded { id }, _) => {
                self.actions.push_back(Action::CawDone { id, result });
            }
            _ => {}
        }
    }

    /// The outcome of a CAW this node executed whose write (if any) is complete.
    pub(super) fn caw_outcome(&self, slot: u32) -> CawOutcome {
        match self.ops.get(slot).and_then(|o| o.caw_stage()) {
            Some(CawStage::Miscompare(i)) => CawOutcome::Miscompare(i),
            _ => CawOutcome::Written,
        }
    }

    /// The peer is lost: forwarded CAWs without an answer may or may not have written.
    pub(super) fn caws_peer_lost(&mut self) {
        for slot in 0..self.ops.len() as u32 {
            let waiting = self.ops.get(slot).is_some_and(|o| {
                matches!(o.kind, Kind::Forwarded { .. }) && o.phase == Phase::Unadmitted
            });
            if waiting {
                self.caw_answer(slot, Err(HostError::Indeterminate));
                self.free(slot);
            }
        }
    }
}
