//! Persistent per-LUN metadata: generation identifiers, the dirty bitmap and the activity log.
//!
//! The core never writes metadata itself: it emits [`MetaOp`]s in a single ordered journal
//! (`Action::Persist`), and the driver makes each durable in order before reporting it done.
//! [`Meta::apply`] is the reference for what an op means; a driver may keep a `Meta` in memory
//! and write it out, or map the ops to on-disk updates, as long as the order is kept: a dirty
//! bit set before an activity-log eviction must be durable no later than the eviction.
//!
//! - **Dirty bitmap**: one bit per region of `region_blocks` blocks; a set bit means the region
//!   may differ from the peer. Bits are set while a node writes without its peer (and for
//!   writes the peer never confirmed), cleared as resync copies regions.
//! - **Activity log (AL)**: a small set of hot extents (`al_extent_blocks` each). Every local
//!   apply happens only once its extents are in the durable AL; an extent leaves the AL only
//!   after a local fsync has covered every write to it. After a crash, whatever the node might
//!   have applied without the peer (or the peer without it) lies inside an AL extent, so the
//!   node merges the AL into its bitmap at start; those regions are only *suspect* (kept
//!   apart in memory) and resync compares them by checksum, copying just the blocks that
//!   differ.
//! - **Generation identifiers** decide at reconnect which side is the sync source and whether
//!   the bitmap is enough (partial resync) or everything must be copied (full resync).

/// Generation identifiers (as DRBD's data generation UUIDs).
///
/// `current` names the data this node holds. A node that starts writing alone moves `current`
/// into `bitmap` (the generation its dirty bitmap counts from) and takes a fresh `current`;
/// a finished resync clears `bitmap` (shifting it into `history`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Generations {
    pub current: u64,
    pub bitmap: u64,
    pub history: [u64; 2],
}

impl Generations {
    /// Start a new generation (this node goes on alone): `current` becomes `bitmap`, unless a
    /// bitmap generation is already open (its bitmap still counts from there).
    pub fn start_alone(&mut self, fresh: u64) {
        if self.bitmap == 0 {
            self.bitmap = self.current;
        }
        self.current = fresh;
    }

    /// Close the bitmap generation after a finished resync.
    pub fn close_bitmap(&mut self) {
        if self.bitmap != 0 {
            self.history = [self.bitmap, self.history[0]];
            self.bitmap = 0;
        }
    }
}

/// A fresh generation identifier, derived from the epoch and node (deterministic, never 0).
pub fn fresh_generation(epoch: u64, node: u8) -> u64 {
    // SplitMix64 of (epoch, node): distinct epochs give distinct values with overwhelming
    // likelihood, and a node never reuses an epoch.
    let mut z = epoch
        .wrapping_mul(2)
        .wrapping_add(u64::from(node))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}

/// One journal entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaOp {
    /// Activity-log slot `slot` now holds `extent` (None: empty). Replaces what it held.
    AlSet { slot: u32, extent: Option<u64> },
    /// Set dirty bits `first .. first + count`.
    BitsSet { first: u64, count: u64 },
    /// Clear dirty bits `first .. first + count`.
    BitsClear { first: u64, count: u64 },
    /// Clear the whole bitmap.
    BitsClearAll,
    /// New generation identifiers.
    Gens(Generations),
    /// The epoch this node last knew and whether it is outdated.
    State { epoch: u64, outdated: bool },
}

/// The persistent metadata of one LUN on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub gens: Generations,
    pub epoch: u64,
    pub outdated: bool,
    /// Dirty bitmap, one bit per region.
    pub bitmap: Vec<u64>,
    /// Activity log slots.
    pub al: Vec<Option<u64>>,
}

impl Meta {
    /// Metadata of a freshly created LUN (both nodes start identical: same `initial`
    /// generation, empty bitmap and AL).
    pub fn new(regions: u64, al_slots: usize, initial_generation: u64) -> Meta {
        Meta {
            gens: Generations {
                current: initial_generation,
                ..Generations::default()
            },
            epoch: 0,
            outdated: false,
            bitmap: vec![0; words_for(regions)],
            al: vec![None; al_slots],
        }
    }

    /// Apply one journal entry. Out-of-range entries are ignored (the core never emits them).
    pub fn apply(&mut self, op: &MetaOp) {
        match *op {
            MetaOp::AlSet { slot, extent } => {
                if let Some(s) = self.al.get_mut(slot as usize) {
                    *s = extent;
                }
            }
            MetaOp::BitsSet { first, count } => set_range(&mut self.bitmap, first, count, true),
            MetaOp::BitsClear { first, count } => set_range(&mut self.bitmap, first, count, false),
            MetaOp::BitsClearAll => self.bitmap.iter_mut().for_each(|w| *w = 0),
            MetaOp::Gens(g) => self.gens = g,
            MetaOp::State { epoch, outdated } => {
                self.epoch = epoch;
                self.outdated = outdated;
            }
        }
    }
}

/// Words needed for `bits` bits.
pub fn words_for(bits: u64) -> usize {
    bits.div_ceil(64) as usize
}

/// Test bit `i` (false when out of range).
pub fn get_bit(words: &[u64], i: u64) -> bool {
    words
        .get((i / 64) as usize)
        .is_some_and(|w| w & (1 << (i % 64)) != 0)
}

/// Set or clear bits `first .. first + count` (clipped to the bitmap).
pub fn set_range(words: &mut [u64], first: u64, count: u64, value: bool) {
    let limit = words.len() as u64 * 64;
    let end = first.saturating_add(count).min(limit);
    let mut i = first;
    while i < end {
        let w = (i / 64) as usize;
        let bit = i % 64;
        let n = (64 - bit).min(end - i);
        let mask = if n == 64 {
            u64::MAX
        } else {
            ((1u64 << n) - 1) << bit
        };
        if value {
            words[w] |= mask;
        } else {
            words[w] &= !mask;
        }
        i += n;
    }
}

/// Whether any bit in `first .. first + count` is clear (clipped to the bitmap).
pub fn any_clear(words: &[u64], first: u64, count: u64) -> bool {
    (first..first.saturating_add(count).min(words.len() as u64 * 64)).any(|i| !get_bit(words, i))
}

/// Whether any bit in `first .. first + count` is set.
pub fn any_set(words: &[u64], first: u64, count: u64) -> bool {
    (first..first.saturating_add(count).min(words.len() as u64 * 64)).any(|i| get_bit(words, i))
}

/// Number of set bits.
pub fn count_set(words: &[u64]) -> u64 {
    words.iter().map(|w| u64::from(w.count_ones())).sum()
}

/// The first set bit at or after `from`, if any.
pub fn next_set(words: &[u64], from: u64) -> Option<u64> {
    let mut w = (from / 64) as usize;
    let mut mask = u64::MAX.checked_shl((from % 64) as u32).unwrap_or(0);
    while w < words.len() {
        let v = words[w] & mask;
        if v != 0 {
            return Some(w as u64 * 64 + u64::from(v.trailing_zeros()));
        }
        w += 1;
        mask = u64::MAX;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_set_and_clear() {
        let mut w = vec![0u64; 3];
        set_range(&mut w, 60, 10, true);
        assert_eq!(count_set(&w), 10);
        assert!(get_bit(&w, 60) && get_bit(&w, 69) && !get_bit(&w, 70) && !get_bit(&w, 59));
        assert_eq!(next_set(&w, 0), Some(60));
        assert_eq!(next_set(&w, 65), Some(65));
        assert_eq!(next_set(&w, 70), None);
        set_range(&mut w, 0, 1000, true);
        assert_eq!(count_set(&w), 192);
        set_range(&mut w, 64, 64, false);
        assert_eq!(count_set(&w), 128);
        assert!(any_clear(&w, 60, 10) && !any_clear(&w, 0, 64) && !any_set(&w, 64, 64));
    }

    #[test]
    fn generations_chain() {
        let mut g = Generations {
            current: 7,
            ..Default::default()
        };
        g.start_alone(9);
        assert_eq!((g.current, g.bitmap), (9, 7));
        g.start_alone(11); // bitmap still counts from 7
        assert_eq!((g.current, g.bitmap), (11, 7));
        g.close_bitmap();
        assert_eq!((g.current, g.bitmap, g.history), (11, 0, [7, 0]));
        assert_ne!(fresh_generation(1, 0), fresh_generation(1, 1));
        assert_ne!(fresh_generation(1, 0), 0);
    }
}
