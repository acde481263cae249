//! The activity log in memory: which extents are hot, which of them are durable, which may
//! be evicted.
//!
//! An operation takes all its extents at once or none ([`ActivityLog::acquire`]), so two
//! operations never hold some extents each while waiting for the others. An extent may be
//! evicted only when no operation uses it and a local fsync has covered its last write; the
//! core issues that fsync when an eviction needs it.
//!
//! Every write takes and gives back its extents on both nodes, so the common case (the
//! extents are already in the log) costs a hash lookup per extent, not a scan of the slots.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes an extent number (a `u64` key) with one multiplication.
#[derive(Default)]
struct ExtentHasher(u64);

impl Hasher for ExtentHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    extent: Option<u64>,
    /// Journal token of the `AlSet` that loaded it (durable once persisted through it).
    token: u64,
    users: u32,
    /// Users that are own writes waiting for the peer (held beyond their local apply).
    own: u32,
    last_use: u64,
    /// Apply-completion counter of the last write to it.
    last_apply: u64,
}

const EMPTY: Slot = Slot {
    extent: None,
    token: 0,
    users: 0,
    own: 0,
    last_use: 0,
    last_apply: 0,
};

/// What [`ActivityLog::acquire`] decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// All extents held; they are durable once the journal reaches `token`.
    Held { token: u64 },
    /// Not enough evictable slots until a local fsync completes.
    NeedSync,
    /// Not enough free slots until operations complete.
    Busy,
}

#[derive(Debug)]
pub(crate) struct ActivityLog {
    slots: Vec<Slot>,
    /// Slot of each extent in the log.
    index: HashMap<u64, usize, BuildHasherDefault<ExtentHasher>>,
    /// Slots with at least one own write (`Slot::own > 0`).
    own_held: usize,
    extent_blocks: u64,
    clock: u64,
    /// Apply-completion counter covered by the last completed fsync.
    pub(crate) synced: u64,
}

impl ActivityLog {
    pub(crate) fn new(slots: usize, extent_blocks: u64) -> ActivityLog {
        ActivityLog {
            slots: vec![EMPTY; slots],
            index: HashMap::with_capacity_and_hasher(slots, Default::default()),
            own_held: 0,
            extent_blocks,
            clock: 0,
            synced: 0,
        }
    }

    /// Extents of blocks `[lba, lba + blocks)`.
    pub(crate) fn extents(&self, lba: u64, blocks: u32) -> (u64, u64) {
        (
            lba / self.extent_blocks,
            (lba + u64::from(blocks.max(1)) - 1) / self.extent_blocks,
        )
    }

    /// Most slots own writes may hold at once. Own writes keep their extents until the peer
    /// confirms, and the peer's writes need slots here to get confirmed: without this bound
    /// the two nodes could each fill their log with writes waiting for the other.
    fn own_limit(&self) -> usize {
        self.slots.len() / 2
    }

    /// Most extents an operation may span.
    pub(crate) fn capacity(&self) -> usize {
        self.own_limit()
    }

    fn find(&self, extent: u64) -> Option<usize> {
        self.index.get(&extent).copied()
    }

    fn evictable(&self, s: &Slot, first: u64, last: u64) -> bool {
        s.users == 0
            && (s.extent.is_none() || s.last_apply <= self.synced)
            && !s.extent.is_some_and(|e| e >= first && e <= last)
    }

    /// Take extents `first..=last` for one operation (`own`: an own write, held until the
    /// peer confirms). `persist` is called for each slot that must be (re)loaded, with
    /// `(slot, extent)`, and returns the journal token of that write.
    pub(crate) fn acquire(
        &mut self,
        first: u64,
        last: u64,
        own: bool,
        mut persist: impl FnMut(u32, u64) -> u64,
    ) -> Acquire {
        if own {
            let held = self.own_held;
            let more = (first..=last)
                .filter(|&e| self.find(e).is_none_or(|i| self.slots[i].own == 0))
                .count();
            if held + more > self.own_limit() {
                return Acquire::Busy;
            }
        }
        let missing = (first..=last).filter(|&e| self.find(e).is_none()).count();
        if missing > 0 {
            let free = self
                .slots
                .iter()
                .filter(|s| self.evictable(s, first, last))
                .count();
            if free < missing {
                let unsynced = self
                    .slots
                    .iter()
                    .filter(|s| s.users == 0 && s.extent.is_some() && s.last_apply > self.synced)
                    .count();
                return if free + unsynced >= missing {
                    Acquire::NeedSync
                } else {
                    Acquire::Busy
                };
            }
        }
        let mut token = 0;
        for e in first..=last {
            self.clock += 1;
            let i = match self.find(e) {
                Some(i) => i,
                None => {
                    // Prefer an empty slot, else the least recently used evictable one.
                    let mut best: Option<usize> = None;
                    for (i, s) in self.slots.iter().enumerate() {
                        if !self.evictable(s, first, last) {
                            continue;
                        }
                        let better = match best {
                            None => true,
                            Some(b) => {
                                let cur = &self.slots[b];
                                cur.extent.is_some()
                                    && (s.extent.is_none() || s.last_use < cur.last_use)
                            }
                        };
                        if better {
                            best = Some(i);
                        }
                    }
                    let Some(i) = best else { return Acquire::Busy };
                    let t = persist(i as u32, e);
                    if let Some(old) = self.slots[i].extent {
                        self.index.remove(&old);
                    }
                    self.index.insert(e, i);
                    self.slots[i] = Slot {
                        extent: Some(e),
                        token: t,
                        ..EMPTY
                    };
                    i
                }
            };
            let s = &mut self.slots[i];
            s.users += 1;
            if own {
                self.own_held += usize::from(s.own == 0);
                s.own += 1;
            }
            s.last_use = self.clock;
            token = token.max(s.token);
        }
        Acquire::Held { token }
    }

    /// Give back extents `first..=last`; `applied` is the apply-completion counter of the write
    /// that used them (0 if nothing was written).
    pub(crate) fn release(&mut self, first: u64, last: u64, applied: u64, own: bool) {
        for e in first..=last {
            if let Some(i) = self.find(e) {
                let s = &mut self.slots[i];
                s.users = s.users.saturating_sub(1);
                if own && s.own > 0 {
                    s.own -= 1;
                    self.own_held -= usize::from(s.own == 0);
                }
                s.last_apply = s.last_apply.max(applied);
            }
        }
    }

    /// Whether an extent that is in the log has writes no fsync has covered.
    pub(crate) fn needs_sync(&self) -> bool {
        self.slots
            .iter()
            .any(|s| s.extent.is_some() && s.last_apply > self.synced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_only_synced_unused_extents() {
        let mut al = ActivityLog::new(4, 8);
        let mut next = 0;
        let mut persist = |_s: u32, _e: u64| {
            next += 1;
            next
        };
        assert_eq!(
            al.acquire(0, 0, false, &mut persist),
            Acquire::Held { token: 1 }
        );
        assert_eq!(
            al.acquire(1, 1, false, &mut persist),
            Acquire::Held { token: 2 }
        );
        assert_eq!(
            al.acquire(2, 3, false, &mut persist),
            Acquire::Held { token: 4 }
        );
        // All slots in use.
        assert_eq!(al.acquire(4, 4, false, &mut persist), Acquire::Busy);
        al.release(0, 0, 5, false);
        // Free of users but written after the last fsync.
        assert_eq!(al.acquire(4, 4, false, &mut persist), Acquire::NeedSync);
        al.synced = 5;
        assert_eq!(
            al.acquire(4, 4, false, &mut persist),
            Acquire::Held { token: 5 }
        );
        // A hit costs nothing new.
        assert_eq!(
            al.acquire(4, 4, false, &mut persist),
            Acquire::Held { token: 5 }
        );
        // Two extents at once: all or nothing.
        al.release(1, 1, 0, false);
        assert_eq!(al.acquire(5, 6, false, &mut persist), Acquire::Busy);
    }

    #[test]
    fn own_writes_hold_at_most_half() {
        let mut al = ActivityLog::new(4, 8);
        let mut next = 0;
        let mut persist = |_s: u32, _e: u64| {
            next += 1;
            next
        };
        assert!(matches!(
            al.acquire(0, 1, true, &mut persist),
            Acquire::Held { .. }
        ));
        assert_eq!(al.acquire(2, 2, true, &mut persist), Acquire::Busy);
        // The same extents again are fine, and so are the peer's writes.
        assert!(matches!(
            al.acquire(1, 1, true, &mut persist),
            Acquire::Held { .. }
        ));
        assert!(matches!(
            al.acquire(2, 3, false, &mut persist),
            Acquire::Held { .. }
        ));
        al.release(0, 0, 0, true);
        assert!(matches!(
            al.acquire(2, 2, true, &mut persist),
            Acquire::Held { .. }
        ));
    }

    /// The index and the own-slot count are what a scan of the slots would find, after any
    /// sequence of acquisitions (hits, loads, evictions, refusals) and releases.
    #[test]
    fn the_index_and_own_count_follow_the_slots() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let mut al = ActivityLog::new(8, 4);
        let mut held: Vec<(u64, u64, bool)> = Vec::new();
        let mut next = 0;
        let (mut evictions, mut refusals) = (0, 0);
        for step in 0..20_000u64 {
            if held.is_empty() || rng.gen_bool(0.55) {
                let first = rng.gen_range(0..24u64);
                let last = first + rng.gen_range(0..2u64);
                let own = rng.gen_bool(0.5);
                let mut loaded = 0;
                match al.acquire(first, last, own, |_, _| {
                    loaded += 1;
                    next += 1;
                    next
                }) {
                    Acquire::Held { .. } => held.push((first, last, own)),
                    _ => refusals += 1,
                }
                evictions += loaded;
            } else {
                let (first, last, own) = held.swap_remove(rng.gen_range(0..held.len()));
                al.release(first, last, step, own);
            }
            if rng.gen_bool(0.05) {
                al.synced = step;
            }
            let own_slots = al.slots.iter().filter(|s| s.own > 0).count();
            assert_eq!(al.own_held, own_slots, "step {step}");
            let in_log: Vec<_> = al.slots.iter().filter_map(|s| s.extent).collect();
            assert_eq!(al.index.len(), in_log.len(), "step {step}");
            for (i, s) in al.slots.iter().enumerate() {
                if let Some(e) = s.extent {
                    assert_eq!(al.find(e), Some(i), "step {step}");
                }
            }
            for &(first, last, _) in &held {
                assert!((first..=last).all(|e| al.find(e).is_some()), "step {step}");
            }
        }
        // The walk went through the interesting cases.
        assert!(evictions > 100 && refusals > 100, "{evictions} {refusals}");
    }
}
