//! The handshake (who is the sync source) and resync.

use super::ops::{Kind, Op, PeerSide, Phase};
use super::{Link, Replica, State};
use crate::action::{Action, Event, Token};
use crate::codec::VERSION;
use crate::config::Nanos;
use crate::meta::{self, Generations, MetaOp};
use crate::wire::{
    Bitmap, BitmapEnd, Body, Flush, Hello, NodeId, ResyncAck, ResyncData, ResyncDone,
};

/// Flush id the sync source uses for the final flush of a resync.
pub(super) const RESYNC_FLUSH: u64 = u64::MAX;

/// Sync source progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSync {
    /// Regions still to copy (own bitmap, peer's bitmap, or everything).
    set: Vec<u64>,
    cursor: u64,
    /// Chunks sent, not yet acknowledged: (lba, blocks).
    sent: Vec<(u64, u32)>,
    reading: u32,
    finishing: bool,
}

/// What a handshake decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// `source` copies to the other: the dirty regions of both (`full`: every region).
    Sync { source: NodeId, full: bool },
    /// No safe way to pair.
    Refuse,
}

/// Decide from both nodes' `Hello` (indexed by node id) who is the sync source — the same
/// answer on both nodes. A node that knows it is outdated is never the source; otherwise the
/// generation identifiers say who moved on from whom; equal data generations resync the dirty
/// regions from the node that holds the epoch alone, else from one that kept running over one
/// that started from disk, else from the preferred node.
pub fn decide(hello: [&Hello; 2], preferred: NodeId) -> Decision {
    let [a, b] = hello;
    let partial = |src: &Generations, dst: &Generations| {
        dst.current == src.current || (src.bitmap != 0 && dst.current == src.bitmap)
    };
    let sync = |source: NodeId| {
        let (s, t) = (hello[source as usize], hello[1 - source as usize]);
        Decision::Sync {
            source,
            full: !partial(&s.gens, &t.gens),
        }
    };
    match (a.outdated, b.outdated) {
        // Both outdated in the same data generation (a race lost against a stale mark, and an
        // interrupted resync): neither acknowledged anything alone since, and the bitmaps cover
        // every difference, so pair as if neither were.
        (true, true) if a.gens.current != b.gens.current => return Decision::Refuse,
        (true, true) => {}
        (true, false) => return if a.alone { Decision::Refuse } else { sync(1) },
        (false, true) => return if b.alone { Decision::Refuse } else { sync(0) },
        (false, false) => {}
    }
    let contradictory = |h: &Hello| h.outdated && h.alone;
    if (a.alone && b.alone) || contradictory(a) || contradictory(b) {
        return Decision::Refuse;
    }
    if a.gens.current == b.gens.current {
        // Equal data: the node that kept running has everything either acknowledged; one
        // that started from disk may have lost unflushed writes to a power loss.
        return sync(if a.alone || (b.booted && !a.booted) {
            0
        } else if b.alone || (a.booted && !b.booted) {
            1
        } else {
            preferred
        });
    }
    if b.gens.bitmap != 0 && b.gens.bitmap == a.gens.current && !a.alone {
        return sync(1);
    }
    if a.gens.bitmap != 0 && a.gens.bitmap == b.gens.current && !b.alone {
        return sync(0);
    }
    match (a.alone, b.alone) {
        (true, false) => sync(0),
        (false, true) => sync(1),
        _ => Decision::Refuse,
    }
}

impl Replica {
    pub(super) fn my_hello(&self) -> Hello {
        Hello {
            version: VERSION,
            gens: self.gens,
            outdated: self.outdated,
            alone: matches!(self.state, State::Alone { .. }),
            booted: matches!(self.state, State::Suspended { serving: false, .. }),
            lun_blocks: self.cfg.lun_blocks,
            block_size: self.cfg.block_size,
            region_blocks: self.cfg.region_blocks,
            next_wseq: self.next_wseq,
        }
    }

    pub(super) fn on_hello(&mut self, now: Nanos, epoch: u64, h: Hello) {
        let matches = h.version == VERSION
            && h.lun_blocks == self.cfg.lun_blocks
            && h.block_size == self.cfg.block_size
            && h.region_blocks == self.cfg.region_blocks;
        let Link::Handshake { hello, .. } = &mut self.link else {
            return;
        };
        if !matches || hello.is_some() {
            self.refuse("Hello", "version, size or repeat mismatch");
            self.drop_peer(now);
            return;
        }
        self.last_peer_wseq = h.next_wseq.saturating_sub(1);
        self.peer_epoch = epoch;
        *hello = Some(h);
    }

    pub(super) fn on_bitmap(&mut self, now: Nanos, b: Bitmap) {
        let Link::Handshake {
            hello: Some(_),
            bits,
        } = &mut self.link
        else {
            self.refuse("Bitmap", "before Hello");
            self.drop_peer(now);
            return;
        };
        let first = usize::try_from(b.first_word).unwrap_or(usize::MAX);
        if first > bits.len() || bits.len() - first < b.words.len() {
            self.refuse("Bitmap", "out of range");
            self.drop_peer(now);
            return;
        }
        for (d, s) in bits[first..].iter_mut().zip(&b.words) {
            *d |= *s;
        }
    }

    pub(super) fn on_bitmap_end(&mut self, now: Nanos, end: BitmapEnd) {
        let link = std::mem::replace(&mut self.link, Link::Up);
        let Link::Handshake {
            hello: Some(peer_hello),
            bits: mut peer_bits,
        } = link
        else {
            self.link = link;
            self.refuse("BitmapEnd", "before Hello");
            self.drop_peer(now);
            return;
        };
        // Regions past the end of the LUN are not ours to copy.
        let regions = self.cfg.regions();
        meta::set_range(&mut peer_bits, regions, u64::MAX, false);
        if meta::count_set(&peer_bits) != end.set_bits {
            self.refuse("BitmapEnd", "bitmap incomplete");
            self.drop_peer(now);
            return;
        }
        let me = self.my_hello();
        let pair = if self.cfg.node == 0 {
            [&me, &peer_hello]
        } else {
            [&peer_hello, &me]
        };
        let decision = decide(pair, self.cfg.preferred);
        let Decision::Sync { source, full } = decision else {
            self.event(Event::SplitBrain);
            self.drop_peer(now);
            return;
        };
        if self.peer_epoch > self.epoch {
            self.epoch = self.peer_epoch;
            self.persist(MetaOp::State {
                epoch: self.epoch,
                outdated: self.outdated,
            });
        }
        if source == self.cfg.node {
            self.become_source(now, peer_bits, full);
        } else if matches!(self.state, State::Alone { .. }) {
            self.event(Event::SplitBrain);
            self.drop_peer(now);
        } else {
            self.become_target(now);
        }
    }

    fn become_source(&mut self, now: Nanos, mut set: Vec<u64>, full: bool) {
        if full {
            self.stats.full_resyncs += 1;
            meta::set_range(&mut set, 0, self.cfg.regions(), true);
        } else {
            for (d, s) in set.iter_mut().zip(&self.bitmap) {
                *d |= *s;
            }
        }
        self.stats.resync_regions += meta::count_set(&set);
        let holds_epoch = matches!(self.state, State::Alone { .. });
        let sync = SourceSync {
            set,
            cursor: 0,
            sent: Vec::new(),
            reading: 0,
            finishing: false,
        };
        self.set_state(State::ResyncSource { holds_epoch, sync });
        // Changes held while the peer was away are this node's to make; then the peer takes
        // the whole state.
        self.shared_release_held();
        self.send_shared_snapshot();
        self.pump(now);
    }

    fn become_target(&mut self, now: Nanos) {
        // Writes held while suspended are overwritten by the source's data: they fail.
        self.fail_held();
        if !self.outdated {
            self.outdated = true;
            self.persist(MetaOp::State {
                epoch: self.epoch,
                outdated: true,
            });
        }
        self.set_state(State::ResyncTarget {
            leader: self.peer(),
        });
        self.pump(now);
    }

    /// Sync source: start reads of dirty regions, and finish when all are acknowledged.
    pub(super) fn resync_step(&mut self) {
        let State::ResyncSource { sync, .. } = &mut self.state else {
            return;
        };
        if sync.finishing {
            return;
        }
        let rb = u64::from(self.cfg.region_blocks);
        let regions = self.cfg.regions();
        let mut starts: [(u64, u32); 8] = [(0, 0); 8];
        let mut n = 0;
        while sync.sent.len() + sync.reading as usize + n < self.cfg.resync_window
            && n < starts.len()
        {
            let Some(r0) = meta::next_set(&sync.set, sync.cursor).filter(|&r| r < regions) else {
                break;
            };
            let mut r1 = r0;
            while r1 + 1 < regions
                && r1 + 1 - r0 < u64::from(self.cfg.resync_chunk_regions)
                && meta::get_bit(&sync.set, r1 + 1)
            {
                r1 += 1;
            }
            meta::set_range(&mut sync.set, r0, r1 - r0 + 1, false);
            sync.cursor = r1 + 1;
            let lba = r0 * rb;
            let blocks = ((r1 + 1) * rb).min(self.cfg.lun_blocks) - lba;
            starts[n] = (lba, blocks as u32);
            n += 1;
        }
        let done = n == 0
            && sync.sent.is_empty()
            && sync.reading == 0
            && meta::next_set(&sync.set, 0).is_none_or(|r| r >= regions);
        if done {
            sync.finishing = true;
            self.send(Body::Flush(Flush { id: RESYNC_FLUSH }));
            return;
        }
        sync.reading += n as u32;
        for &(lba, blocks) in &starts[..n] {
            let op = Op::new(
                Kind::ResyncRead,
                lba,
                blocks,
                false,
                bytes::Bytes::new(),
                self.session,
            );
            if let Some(slot) = self.ops.insert(op) {
                self.admit_other(slot);
            }
        }
        if n > 0 {
            self.start_ready();
        }
    }

    /// A local read for resync finished.
    pub fn resync_read_done(&mut self, now: Nanos, token: Token, data: bytes::Bytes) {
        let Some(slot) = self.ops.slot_of(token) else {
            return;
        };
        let Some(op) = self.ops.get(slot) else { return };
        if op.kind != Kind::ResyncRead || op.phase != Phase::Running {
            return;
        }
        let (lba, blocks, session) = (op.lba, op.blocks, op.session);
        self.free(slot);
        let current = session == self.session && self.link == Link::Up;
        let ok = data.len() as u64 == u64::from(blocks) * u64::from(self.cfg.block_size);
        if let State::ResyncSource { sync, .. } = &mut self.state {
            if current {
                sync.reading = sync.reading.saturating_sub(1);
                if ok {
                    sync.sent.push((lba, blocks));
                } else {
                    // A short read: copy these regions again.
                    let rb = u64::from(self.cfg.region_blocks);
                    meta::set_range(
                        &mut sync.set,
                        lba / rb,
                        u64::from(blocks).div_ceil(rb),
                        true,
                    );
                    sync.cursor = sync.cursor.min(lba / rb);
                }
            }
        }
        if current && ok && matches!(self.state, State::ResyncSource { .. }) {
            self.stats.resync_blocks += u64::from(blocks);
            self.send(Body::ResyncData(ResyncData { lba, blocks, data }));
        }
        self.pump(now);
    }

    pub(super) fn on_resync_data(&mut self, now: Nanos, d: ResyncData) {
        if !matches!(self.state, State::ResyncTarget { .. }) {
            self.refuse("ResyncData", "not a sync target");
            return;
        }
        let valid = d.blocks > 0
            && d.lba
                .checked_add(u64::from(d.blocks))
                .is_some_and(|e| e <= self.cfg.lun_blocks)
            && d.data.len() as u64 == u64::from(d.blocks) * u64::from(self.cfg.block_size)
            && {
                let (e0, e1) = self.al.extents(d.lba, d.blocks);
                ((e1 - e0) as usize) < self.al.capacity()
            };
        if !valid {
            self.refuse("ResyncData", "malformed");
            self.drop_peer(now);
            return;
        }
        let op = Op::new(
            Kind::ResyncApply,
            d.lba,
            d.blocks,
            false,
            d.data,
            self.session,
        );
        let Some(slot) = self.ops.insert(op) else {
            self.refuse("ResyncData", "too many operations in flight");
            self.drop_peer(now);
            return;
        };
        self.admit_other(slot);
        self.pump(now);
    }

    pub(super) fn on_resync_ack(&mut self, now: Nanos, a: ResyncAck) {
        let State::ResyncSource { sync, .. } = &mut self.state else {
            self.refuse("ResyncAck", "not a sync source");
            return;
        };
        let Some(i) = sync.sent.iter().position(|&c| c == (a.lba, a.blocks)) else {
            self.refuse("ResyncAck", "unknown chunk");
            return;
        };
        sync.sent.swap_remove(i);
        let remaining = meta::count_set(&sync.set) + sync.sent.len() as u64;
        self.clear_dirty(a.lba, a.blocks);
        self.actions.push_back(Action::ResyncProgress { remaining });
        self.pump(now);
    }

    /// The final flush of a resync is acknowledged: the pair is in sync.
    pub(super) fn finish_source(&mut self, now: Nanos) {
        let State::ResyncSource { sync, .. } = &self.state else {
            return;
        };
        if !sync.finishing {
            return;
        }
        if meta::count_set(&self.bitmap) == 0 {
            self.gens.close_bitmap();
        }
        self.outdated = false;
        self.persist(MetaOp::Gens(self.gens));
        self.persist(MetaOp::State {
            epoch: self.epoch,
            outdated: false,
        });
        self.send(Body::ResyncDone(ResyncDone { gens: self.gens }));
        self.set_state(State::Paired {
            leader: self.cfg.node,
        });
        self.release_held(PeerSide::Acked);
        let epoch = self.epoch;
        self.actions.push_back(Action::MarkInSync { epoch });
        self.pump(now);
    }

    pub(super) fn on_resync_done(&mut self, now: Nanos, d: ResyncDone) {
        let State::ResyncTarget { leader } = self.state else {
            self.refuse("ResyncDone", "not a sync target");
            return;
        };
        self.gens = d.gens;
        self.outdated = false;
        self.bitmap.iter_mut().for_each(|w| *w = 0);
        self.persist(MetaOp::Gens(self.gens));
        self.persist(MetaOp::BitsClearAll);
        self.persist(MetaOp::State {
            epoch: self.epoch,
            outdated: false,
        });
        self.set_state(State::Paired { leader });
        self.pump(now);
    }
}
