//! The handshake (who is the sync source) and resync.
//!
//! # What is copied, what is compared
//!
//! Every handshake exchanges both dirty bitmaps and, within them, the *suspect* regions: those
//! set only because they lay in an activity-log extent when the node crashed (see
//! `Replica::suspect`). A dirty region is known to differ and is copied whole (`ResyncData`).
//! A suspect region may hold writes the crashed node applied without the peer, writes the peer
//! applied without it, torn or lost blocks, or nothing at all: the source reads it, sends a
//! checksum of each block (`ResyncSums`, 8 bytes of SHA-256), the target reads its own blocks and answers which
//! differ (`ResyncDiffer`), and only the regions of those blocks join the copy set. Either
//! side's suspect regions are compared, whichever node is the source.
//!
//! Why this is as safe as copying:
//!
//! - The checksums are read exactly where the data would have been (a `ResyncSum` is ordered
//!   among the source's operations like a `ResyncRead`: an own write overlapping it is admitted,
//!   hence sent, only after the checksums are sent), and travel on the data channel, so the
//!   target compares (its `ResyncCompare` is ordered among the peer writes like a
//!   `ResyncApply`) against the blocks as they are after every write the source sent before the
//!   checksums and before any it sent after. Matching blocks are then what the data would have
//!   made them (up to a checksum collision, 2^-64 per differing block).
//! - A differing block is never written from the checksum exchange: its region is copied by a
//!   fresh `ResyncRead` after the answer arrived, i.e. ordered after every write the source
//!   made meanwhile, so a survivor's write racing the resync is never overwritten with older
//!   data (the argument of `ResyncData`).
//! - The source finishes (final flush, `ResyncDone`) only once no region is left to compare,
//!   no checksum answer is outstanding, and every differing region was copied and
//!   acknowledged: the target does not pair while a suspect block still differs.
//! - The source clears its own dirty bit of a compared region only when it matched; a
//!   differing one stays dirty (and stops being suspect) until its copy is acknowledged. The
//!   target keeps its bitmap until `ResyncDone`. So a resync cut at any point leaves every
//!   possible difference in a bitmap for the next handshake.

use super::ops::{Kind, Op, PeerSide, Phase};
use super::{Link, Replica, State};
use crate::action::{Action, Event, Token};
use crate::codec::VERSION;
use crate::config::Nanos;
use crate::meta::{self, Generations, MetaOp};
use crate::wire::{
    BitmapEnd, Body, Flush, Hello, NodeId, ResyncAck, ResyncData, ResyncDiffer, ResyncDone,
    ResyncSums,
};

/// Flush id the sync source uses for the final flush of a resync.
pub(super) const RESYNC_FLUSH: u64 = u64::MAX;

/// Sync source progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSync {
    /// Regions still to copy (either side's dirty regions that are not merely suspect,
    /// suspect regions found to differ, or everything).
    set: Vec<u64>,
    cursor: u64,
    /// Suspect regions still to compare by checksum.
    compare: Vec<u64>,
    compare_cursor: u64,
    /// Chunks sent, not yet acknowledged: (lba, blocks).
    sent: Vec<(u64, u32)>,
    /// Checksum chunks sent, not yet answered: (lba, blocks).
    summed: Vec<(u64, u32)>,
    /// Reads in flight (data and checksums).
    reading: u32,
    finishing: bool,
}

impl SourceSync {
    /// One line for a stalled-resync report.
    pub(super) fn describe(&self) -> String {
        format!(
            "to copy {} to compare {} sent {:?} summed {:?} reading {} finishing {}",
            meta::count_set(&self.set),
            meta::count_set(&self.compare),
            self.sent,
            self.summed,
            self.reading,
            self.finishing
        )
    }

    /// Chunk `(lba, blocks)` was taken but could not start: copy (or compare) it later.
    fn put_back(&mut self, lba: u64, blocks: u32, sums: bool, cfg: &crate::config::Config) {
        let rb = u64::from(cfg.region_blocks);
        let (set, cursor) = if sums {
            (&mut self.compare, &mut self.compare_cursor)
        } else {
            (&mut self.set, &mut self.cursor)
        };
        meta::set_range(set, lba / rb, u64::from(blocks).div_ceil(rb), true);
        *cursor = (*cursor).min(lba / rb);
    }

    fn remaining(&self) -> u64 {
        meta::count_set(&self.set)
            + meta::count_set(&self.compare)
            + self.sent.len() as u64
            + self.summed.len() as u64
    }
}

/// Take the next chunk of set regions at or after `*cursor` (clearing them): `(lba, blocks)`.
fn take_chunk(
    set: &mut [u64],
    cursor: &mut u64,
    cfg: &crate::config::Config,
) -> Option<(u64, u32)> {
    let rb = u64::from(cfg.region_blocks);
    let regions = cfg.regions();
    let r0 = meta::next_set(set, *cursor).filter(|&r| r < regions)?;
    let mut r1 = r0;
    while r1 + 1 < regions
        && r1 + 1 - r0 < u64::from(cfg.resync_chunk_regions)
        && meta::get_bit(set, r1 + 1)
    {
        r1 += 1;
    }
    meta::set_range(set, r0, r1 - r0 + 1, false);
    *cursor = r1 + 1;
    let lba = r0 * rb;
    let blocks = ((r1 + 1) * rb).min(cfg.lun_blocks) - lba;
    Some((lba, blocks as u32))
}

/// Bytes of checksum per block in `ResyncSums`.
pub const SUM_BYTES: usize = 8;

/// The checksum of each `block_size` block of `data`: the first 8 bytes of its SHA-256. The
/// driver computes these where it reads the blocks (`Action::ReadForResync` with `sums`), not
/// the core: hashing a chunk takes long enough (a millisecond for 256 KiB, far more in a
/// debug build) that, on the task that also answers heartbeats, a resync under load made
/// the peer declare the node silent and start the resync over, again and again.
///
/// Not CRC32C: a CRC is affine, so every block that ends with the CRC32C of the rest (a
/// common on-disk layout, and the simulation's block tags) has the same CRC32C, and blocks
/// with a CRC field elsewhere collide far more often than 2^-32. A truncated cryptographic
/// hash has no such structure: 2^-64 per differing block.
pub fn block_sums(data: &[u8], block_size: u32) -> Vec<u8> {
    use sha2::Digest;
    let mut out = Vec::with_capacity(data.len() / block_size as usize * SUM_BYTES);
    for b in data.chunks(block_size as usize) {
        out.extend_from_slice(&sha2::Sha256::digest(b)[..SUM_BYTES]);
    }
    out
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
            self.refuse_and_drop(now, "Hello", "version, size or repeat mismatch");
            return;
        }
        self.last_peer_wseq = h.next_wseq.saturating_sub(1);
        self.peer_epoch = epoch;
        *hello = Some(h);
    }

    /// A `Bitmap` (or with `suspect`, a `Suspect`) chunk of the peer's.
    pub(super) fn on_bitmap(
        &mut self,
        now: Nanos,
        first_word: u64,
        words: Vec<u64>,
        suspect: bool,
    ) {
        let name = if suspect { "Suspect" } else { "Bitmap" };
        let Link::Handshake {
            hello: Some(_),
            bits,
            suspect: sus,
        } = &mut self.link
        else {
            self.refuse_and_drop(now, name, "before Hello");
            return;
        };
        let bits = if suspect { sus } else { bits };
        let first = usize::try_from(first_word).unwrap_or(usize::MAX);
        if first > bits.len() || bits.len() - first < words.len() {
            self.refuse_and_drop(now, name, "out of range");
            return;
        }
        for (d, s) in bits[first..].iter_mut().zip(&words) {
            *d |= *s;
        }
    }

    pub(super) fn on_bitmap_end(&mut self, now: Nanos, end: BitmapEnd) {
        let link = std::mem::replace(&mut self.link, Link::Up);
        let Link::Handshake {
            hello: Some(peer_hello),
            bits: mut peer_bits,
            suspect: mut peer_suspect,
        } = link
        else {
            self.link = link;
            self.refuse_and_drop(now, "BitmapEnd", "before Hello");
            return;
        };
        // Regions past the end of the LUN are not ours to copy.
        let regions = self.cfg.regions();
        meta::set_range(&mut peer_bits, regions, u64::MAX, false);
        meta::set_range(&mut peer_suspect, regions, u64::MAX, false);
        if meta::count_set(&peer_bits) != end.set_bits {
            self.refuse_and_drop(now, "BitmapEnd", "bitmap incomplete");
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
            self.become_source(now, peer_bits, peer_suspect, full);
        } else if matches!(self.state, State::Alone { .. }) {
            self.event(Event::SplitBrain);
            self.drop_peer(now);
        } else {
            self.become_target(now);
        }
    }

    fn become_source(&mut self, now: Nanos, mut set: Vec<u64>, peer_suspect: Vec<u64>, full: bool) {
        let mut compare = vec![0; set.len()];
        if full {
            self.stats.full_resyncs += 1;
            meta::set_range(&mut set, 0, self.cfg.regions(), true);
        } else {
            // Known to differ: either side's dirty regions that are not merely suspect. To
            // compare: the suspect ones of either side, unless the other side's are dirty.
            for (i, (d, c)) in set.iter_mut().zip(compare.iter_mut()).enumerate() {
                let peer = *d;
                let peer_sus = peer_suspect.get(i).copied().unwrap_or(0) & peer;
                let own = self.bitmap.get(i).copied().unwrap_or(0);
                let own_sus = self.suspect.get(i).copied().unwrap_or(0) & own;
                *d = (peer & !peer_sus) | (own & !own_sus);
                *c = (peer_sus | own_sus) & !*d;
            }
        }
        self.stats.resync_regions += meta::count_set(&set) + meta::count_set(&compare);
        let holds_epoch = matches!(self.state, State::Alone { .. });
        let sync = SourceSync {
            set,
            cursor: 0,
            compare,
            compare_cursor: 0,
            sent: Vec::new(),
            summed: Vec::new(),
            reading: 0,
            finishing: false,
        };
        self.resync_moved = now;
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
        self.resync_moved = now;
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
        let regions = self.cfg.regions();
        // Data chunks first, then checksum chunks (`true`).
        let mut starts: [(u64, u32, bool); 8] = [(0, 0, false); 8];
        let mut n = 0;
        while sync.sent.len() + sync.summed.len() + sync.reading as usize + n
            < self.cfg.resync_window
            && n < starts.len()
        {
            if let Some((lba, blocks)) = take_chunk(&mut sync.set, &mut sync.cursor, &self.cfg) {
                starts[n] = (lba, blocks, false);
            } else if let Some((lba, blocks)) =
                take_chunk(&mut sync.compare, &mut sync.compare_cursor, &self.cfg)
            {
                starts[n] = (lba, blocks, true);
            } else {
                break;
            }
            n += 1;
        }
        let done = n == 0
            && sync.sent.is_empty()
            && sync.summed.is_empty()
            && sync.reading == 0
            && meta::next_set(&sync.set, 0).is_none_or(|r| r >= regions)
            && meta::next_set(&sync.compare, 0).is_none_or(|r| r >= regions);
        if done {
            sync.finishing = true;
            self.send(Body::Flush(Flush { id: RESYNC_FLUSH }));
            return;
        }
        let mut started = 0;
        for &(lba, blocks, sums) in &starts[..n] {
            let kind = if sums {
                Kind::ResyncSum
            } else {
                Kind::ResyncRead
            };
            let op = Op::new(kind, lba, blocks, false, bytes::Bytes::new(), self.session);
            match self.ops.insert(op) {
                Some(slot) => {
                    if let State::ResyncSource { sync, .. } = &mut self.state {
                        sync.reading += 1;
                    }
                    started += 1;
                    self.admit_other(slot);
                }
                None => {
                    // Every slot is taken (operations of an old connection may still hold
                    // some): these regions wait for the next step, started when a slot frees.
                    if let State::ResyncSource { sync, .. } = &mut self.state {
                        sync.put_back(lba, blocks, sums, &self.cfg);
                    }
                    self.stats.resync_deferred += 1;
                }
            }
        }
        if started > 0 {
            self.start_ready();
        }
    }

    /// A local read for resync finished: the blocks, or for a read with `sums` their
    /// [`block_sums`].
    pub fn resync_read_done(&mut self, now: Nanos, token: Token, data: bytes::Bytes) {
        let Some(slot) = self.ops.slot_of(token) else {
            return;
        };
        let Some(op) = self.ops.get(slot) else { return };
        if !op.is_resync_read() || op.phase != Phase::Running {
            return;
        }
        let (kind, lba, blocks, session) = (op.kind, op.lba, op.blocks, op.session);
        let sums = op.data.clone();
        self.free(slot);
        let current = session == self.session && self.link == Link::Up;
        if current {
            self.resync_moved = now;
        }
        let per_block = if kind == Kind::ResyncRead {
            self.cfg.block_size as usize
        } else {
            SUM_BYTES
        };
        let ok = data.len() as u64 == u64::from(blocks) * per_block as u64;
        if kind == Kind::ResyncCompare {
            if current && matches!(self.state, State::ResyncTarget { .. }) {
                // A short read counts as differing everywhere: those blocks are copied.
                let mut differ = vec![0u8; (blocks as usize).div_ceil(8)];
                let mine: &[u8] = if ok { &data } else { &[] };
                for i in 0..blocks as usize {
                    let at = SUM_BYTES * i..SUM_BYTES * (i + 1);
                    if mine.get(at.clone()) != sums.get(at) {
                        differ[i / 8] |= 1 << (i % 8);
                    }
                }
                self.send(Body::ResyncDiffer(ResyncDiffer {
                    lba,
                    blocks,
                    differ: differ.into(),
                }));
            }
            self.pump(now);
            return;
        }
        let checksums = kind == Kind::ResyncSum;
        if let State::ResyncSource { sync, .. } = &mut self.state {
            if current {
                sync.reading = sync.reading.saturating_sub(1);
                if ok && checksums {
                    sync.summed.push((lba, blocks));
                } else if ok {
                    sync.sent.push((lba, blocks));
                } else {
                    // A short read: do these regions again.
                    sync.put_back(lba, blocks, checksums, &self.cfg);
                }
            }
        }
        if current && ok && matches!(self.state, State::ResyncSource { .. }) {
            if checksums {
                self.stats.resync_compared_blocks += u64::from(blocks);
                self.send(Body::ResyncSums(ResyncSums {
                    lba,
                    blocks,
                    sums: data,
                }));
            } else {
                self.stats.resync_blocks += u64::from(blocks);
                self.send(Body::ResyncData(ResyncData { lba, blocks, data }));
            }
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
            self.refuse_and_drop(now, "ResyncData", "malformed");
            return;
        }
        self.resync_moved = now;
        let op = Op::new(
            Kind::ResyncApply,
            d.lba,
            d.blocks,
            false,
            d.data,
            self.session,
        );
        let Some(slot) = self.ops.insert(op) else {
            self.refuse_and_drop(now, "ResyncData", "too many operations in flight");
            return;
        };
        self.admit_other(slot);
        self.pump(now);
    }

    /// Sync target: compare these checksums with our blocks, in order with the peer's writes.
    pub(super) fn on_resync_sums(&mut self, now: Nanos, d: ResyncSums) {
        if !matches!(self.state, State::ResyncTarget { .. }) {
            self.refuse("ResyncSums", "not a sync target");
            return;
        }
        let valid = d.blocks > 0
            && d.lba
                .checked_add(u64::from(d.blocks))
                .is_some_and(|e| e <= self.cfg.lun_blocks)
            && d.sums.len() as u64 == u64::from(d.blocks) * SUM_BYTES as u64;
        if !valid {
            self.refuse_and_drop(now, "ResyncSums", "malformed");
            return;
        }
        self.resync_moved = now;
        let op = Op::new(
            Kind::ResyncCompare,
            d.lba,
            d.blocks,
            false,
            d.sums,
            self.session,
        );
        let Some(slot) = self.ops.insert(op) else {
            self.refuse_and_drop(now, "ResyncSums", "too many operations in flight");
            return;
        };
        self.admit_other(slot);
        self.pump(now);
    }

    /// Sync source: the target compared a checksum chunk. Matching regions are in sync;
    /// differing ones are copied.
    pub(super) fn on_resync_differ(&mut self, now: Nanos, a: ResyncDiffer) {
        let State::ResyncSource { sync, .. } = &mut self.state else {
            self.refuse("ResyncDiffer", "not a sync source");
            return;
        };
        let Some(i) = sync.summed.iter().position(|&c| c == (a.lba, a.blocks)) else {
            self.refuse("ResyncDiffer", "unknown chunk");
            return;
        };
        if a.differ.len() != (a.blocks as usize).div_ceil(8) {
            self.refuse_and_drop(now, "ResyncDiffer", "malformed");
            return;
        }
        sync.summed.swap_remove(i);
        self.resync_moved = now;
        let rb = u64::from(self.cfg.region_blocks);
        let differs = |b: u64| a.differ[(b / 8) as usize] & (1 << (b % 8)) != 0;
        let (first, end) = (a.lba / rb, (a.lba + u64::from(a.blocks)).div_ceil(rb));
        let mut same = Vec::new();
        for r in first..end {
            let b0 = (r * rb).max(a.lba) - a.lba;
            let b1 = ((r + 1) * rb).min(a.lba + u64::from(a.blocks)) - a.lba;
            if (b0..b1).any(differs) {
                meta::set_range(&mut sync.set, r, 1, true);
                sync.cursor = sync.cursor.min(r);
                // Known to differ now: dirty (its bit stays) until copied.
                meta::set_range(&mut self.suspect, r, 1, false);
            } else {
                same.push(r);
            }
        }
        let remaining = sync.remaining();
        for r in same {
            self.clear_dirty(r * rb, rb as u32);
        }
        self.actions.push_back(Action::ResyncProgress { remaining });
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
        self.resync_moved = now;
        let remaining = sync.remaining();
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
        self.suspect.iter_mut().for_each(|w| *w = 0);
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

#[cfg(test)]
mod tests;
