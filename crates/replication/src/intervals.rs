//! The set of in-flight operations as block intervals, for overlap queries.
//!
//! A sorted vector of `(start, end, slot)` plus the longest interval ever inserted: the
//! overlaps of `[s, e)` are found by a binary search for `s - longest` and a scan up to `e`.
//! The capacity is reserved up front, so the steady state does not allocate.

#[derive(Debug)]
pub(crate) struct Intervals {
    v: Vec<(u64, u64, u32)>,
    longest: u64,
}

impl Intervals {
    pub(crate) fn with_capacity(n: usize) -> Intervals {
        Intervals {
            v: Vec::with_capacity(n),
            longest: 0,
        }
    }

    pub(crate) fn insert(&mut self, start: u64, end: u64, slot: u32) {
        let i = self.v.partition_point(|&(s, _, _)| s <= start);
        self.v.insert(i, (start, end, slot));
        self.longest = self.longest.max(end - start);
    }

    pub(crate) fn remove(&mut self, start: u64, slot: u32) {
        let from = self.v.partition_point(|&(s, _, _)| s < start);
        if let Some(i) = self.v[from..]
            .iter()
            .position(|&(s, _, x)| x == slot || s > start)
        {
            if self.v[from + i].2 == slot {
                self.v.remove(from + i);
            }
        }
    }

    /// Slots whose interval overlaps `[start, end)`.
    pub(crate) fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = u32> + '_ {
        let from = self
            .v
            .partition_point(|&(s, _, _)| s < start.saturating_sub(self.longest));
        self.v[from..]
            .iter()
            .take_while(move |&&(s, _, _)| s < end)
            .filter(move |&&(_, e, _)| e > start)
            .map(|&(_, _, x)| x)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.v.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn matches_a_linear_scan(ops in proptest::collection::vec((0u64..100, 1u64..20, any::<bool>()), 1..60), q in (0u64..120, 1u64..30)) {
            let mut set = Intervals::with_capacity(8);
            let mut model: Vec<(u64, u64, u32)> = Vec::new();
            for (slot, &(s, len, keep)) in ops.iter().enumerate() {
                set.insert(s, s + len, slot as u32);
                model.push((s, s + len, slot as u32));
                if !keep {
                    set.remove(s, slot as u32);
                    model.retain(|m| m.2 != slot as u32);
                }
            }
            prop_assert_eq!(set.len(), model.len());
            let mut got: Vec<u32> = set.overlapping(q.0, q.0 + q.1).collect();
            got.sort_unstable();
            let mut want: Vec<u32> = model.iter().filter(|m| m.0 < q.0 + q.1 && m.1 > q.0).map(|m| m.2).collect();
            want.sort_unstable();
            prop_assert_eq!(got, want);
        }
    }
}
