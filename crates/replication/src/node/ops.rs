//! The slab of operations in flight (own writes, peer writes, resync reads and applies).

use bytes::Bytes;

use crate::action::WriteId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A host write submitted on this node.
    Own { id: WriteId },
    /// A write replicated from the peer.
    Peer { wseq: u64 },
    /// A peer write this node (the leader) refused as superseded: applies nothing, but is
    /// acknowledged only once the writes that cover it are applied here, so the peer cannot
    /// acknowledge it while a read here would still find older data.
    Superseded { wseq: u64 },
    /// Sync source: reading dirty regions to send.
    ResyncRead,
    /// Sync source: reading suspect regions to send their checksums.
    ResyncSum,
    /// Sync target: reading suspect regions to compare with the source's checksums
    /// (`Op::data`: the checksums).
    ResyncCompare,
    /// Sync target: applying resync data.
    ResyncApply,
    /// Follower: a host COMPARE AND WRITE forwarded to the leader. Unordered until its result
    /// arrives; then ordered like a peer write and answered once every operation ordered
    /// before it here is applied.
    Forwarded { id: WriteId },
}

/// Where a COMPARE AND WRITE this node executes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CawOrigin {
    /// A host of this node (`Kind::Own { id }` names it).
    Host,
    /// Forwarded by the follower: answered with a `CawResult { id: wire }` on `session`.
    Peer { wire: u64, session: u64 },
}

/// Where a COMPARE AND WRITE stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CawStage {
    /// Ordered (or waiting to be): its read compares when its turn comes.
    Compare,
    /// Matched: `Op::data` is being written like an own write.
    Write,
    /// Differed at this byte; nothing written (held while the epoch race runs).
    Miscompare(u64),
}

/// The COMPARE AND WRITE part of an operation (rare: boxed, so plain writes stay small).
#[derive(Debug, Clone)]
pub(crate) struct CawPart {
    pub(crate) origin: CawOrigin,
    pub(crate) verify: Bytes,
    pub(crate) stage: CawStage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Own write not yet ordered (waiting for the activity log or a resync read).
    Unadmitted,
    /// Ordered; waiting for the activity log and for earlier overlapping operations.
    Waiting,
    /// Local I/O issued.
    Running,
    /// Local I/O done.
    Done,
}

/// Where an own write stands with the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerSide {
    /// Not an own write, or not admitted yet.
    None,
    /// Sent, not acknowledged.
    Sent,
    /// Acknowledged as applied or superseded.
    Acked,
    /// The peer is lost and the epoch race is open: the host acknowledgement waits.
    Held,
    /// This node writes alone: local completion suffices (dirty bits set).
    Local,
}

#[derive(Debug, Clone)]
pub(crate) struct Op {
    pub(crate) kind: Kind,
    pub(crate) lba: u64,
    pub(crate) blocks: u32,
    pub(crate) fua: bool,
    pub(crate) data: Bytes,
    /// Local application order among overlapping operations.
    pub(crate) order: u64,
    /// Own writes: the write sequence number of the last send.
    pub(crate) wseq: u64,
    pub(crate) phase: Phase,
    pub(crate) peer: PeerSide,
    /// Activity-log extents held, with the journal token that makes them durable.
    pub(crate) al: Option<u64>,
    /// Apply-completion counter when its local I/O finished (for the activity log).
    pub(crate) applied_at: u64,
    /// The peer asked for this write again once it is applied here.
    pub(crate) retry: bool,
    /// The host has its answer.
    pub(crate) host_done: bool,
    /// Peer connection this operation belongs to (peer writes, resync).
    pub(crate) session: u64,
    /// A COMPARE AND WRITE this node executes (`Kind::Own`) or forwarded (`Kind::Forwarded`).
    pub(crate) caw: Option<Box<CawPart>>,
}

impl Op {
    pub(crate) fn new(
        kind: Kind,
        lba: u64,
        blocks: u32,
        fua: bool,
        data: Bytes,
        session: u64,
    ) -> Op {
        Op {
            kind,
            lba,
            blocks,
            fua,
            data,
            order: 0,
            wseq: 0,
            phase: Phase::Unadmitted,
            peer: PeerSide::None,
            al: None,
            applied_at: 0,
            retry: false,
            host_done: false,
            session,
            caw: None,
        }
    }

    pub(crate) fn end(&self) -> u64 {
        self.lba + u64::from(self.blocks)
    }

    pub(crate) fn needs_al(&self) -> bool {
        !matches!(
            self.kind,
            Kind::ResyncRead
                | Kind::ResyncSum
                | Kind::ResyncCompare
                | Kind::Superseded { .. }
                | Kind::Forwarded { .. }
        )
    }

    /// A local read for resync (answered with `resync_read_done`).
    pub(crate) fn is_resync_read(&self) -> bool {
        matches!(
            self.kind,
            Kind::ResyncRead | Kind::ResyncSum | Kind::ResyncCompare
        )
    }

    /// The COMPARE AND WRITE stage, if this is one this node executes.
    pub(crate) fn caw_stage(&self) -> Option<CawStage> {
        self.caw.as_ref().map(|c| c.stage)
    }

    /// Counted against this node's host requests in flight (own writes and CAWs of this
    /// node's hosts, not CAWs the peer forwarded).
    pub(crate) fn is_host(&self) -> bool {
        match self.kind {
            Kind::Own { .. } => self
                .caw
                .as_ref()
                .is_none_or(|c| c.origin == CawOrigin::Host),
            Kind::Forwarded { .. } => true,
            _ => false,
        }
    }
}

/// Fixed-capacity slab; tokens carry a generation so a stale completion is recognised.
#[derive(Debug)]
pub(crate) struct Slab {
    slots: Vec<Option<Op>>,
    gens: Vec<u32>,
    free: Vec<u32>,
    /// One bit per slot: set when its operation became [`Phase::Waiting`], cleared when a
    /// visit finds it no longer waiting. Every waiting operation's bit is set, so a pass over
    /// the set bits sees what a pass over every slot would, without visiting the rest.
    noted: Vec<u64>,
}

impl Slab {
    pub(crate) fn new(n: usize) -> Slab {
        Slab {
            slots: vec![None; n],
            gens: vec![0; n],
            free: (0..n as u32).rev().collect(),
            noted: vec![0; n.div_ceil(64)],
        }
    }

    /// Note that slot `i`'s operation is now waiting.
    pub(crate) fn note_waiting(&mut self, i: u32) {
        if let Some(w) = self.noted.get_mut(i as usize / 64) {
            *w |= 1 << (i % 64);
        }
    }

    /// Forget slot `i`'s note (its operation no longer waits).
    pub(crate) fn clear_note(&mut self, i: u32) {
        if let Some(w) = self.noted.get_mut(i as usize / 64) {
            *w &= !(1 << (i % 64));
        }
    }

    /// The first noted slot at or after `from`, in index order.
    pub(crate) fn next_noted(&self, from: u32) -> Option<u32> {
        let mut word = from as usize / 64;
        let mut bits = *self.noted.get(word)? & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some((word * 64) as u32 + bits.trailing_zeros());
            }
            word += 1;
            bits = *self.noted.get(word)?;
        }
    }

    pub(crate) fn insert(&mut self, op: Op) -> Option<u32> {
        let i = self.free.pop()?;
        self.slots[i as usize] = Some(op);
        Some(i)
    }

    pub(crate) fn remove(&mut self, i: u32) -> Option<Op> {
        let op = self.slots.get_mut(i as usize)?.take()?;
        self.gens[i as usize] = self.gens[i as usize].wrapping_add(1);
        self.free.push(i);
        Some(op)
    }

    pub(crate) fn get(&self, i: u32) -> Option<&Op> {
        self.slots.get(i as usize)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, i: u32) -> Option<&mut Op> {
        self.slots.get_mut(i as usize)?.as_mut()
    }

    pub(crate) fn token(&self, i: u32) -> u64 {
        u64::from(self.gens[i as usize]) << 32 | u64::from(i)
    }

    /// The slot a token names, if it is still the same operation.
    pub(crate) fn slot_of(&self, token: u64) -> Option<u32> {
        let i = (token & 0xffff_ffff) as u32;
        let gen = (token >> 32) as u32;
        (self.gens.get(i as usize) == Some(&gen) && self.get(i).is_some()).then_some(i)
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Slots in use, in index order.
    pub(crate) fn occupied(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| i as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::Slab;

    #[test]
    fn noted_slots_come_back_in_index_order_across_words() {
        let mut s = Slab::new(200);
        assert_eq!(s.next_noted(0), None);
        for i in [130, 3, 64, 63, 199] {
            s.note_waiting(i);
        }
        let mut seen = Vec::new();
        let mut cursor = 0;
        while let Some(i) = s.next_noted(cursor) {
            seen.push(i);
            cursor = i + 1;
        }
        assert_eq!(seen, [3, 63, 64, 130, 199]);
        s.clear_note(64);
        assert_eq!(s.next_noted(64), Some(130));
        assert_eq!(s.next_noted(200), None);
        // Out of range: ignored, never a panic.
        s.note_waiting(10_000);
        s.clear_note(10_000);
        assert_eq!(s.next_noted(10_000), None);
    }
}
