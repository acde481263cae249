//! A log-linear latency histogram: fixed buckets, no allocation per record, mergeable.

use std::time::Duration;

/// Sub-buckets per power of two: relative precision 1/32 (about 3 %), like HDR with 2 digits.
const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
const LINEAR: u64 = 2 * SUB as u64;
const BUCKETS: usize = LINEAR as usize + (64 - SUB_BITS as usize - 1) * SUB;

/// Log-linear latency histogram in nanoseconds: fixed buckets, no allocation per record.
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
    sum_ns: u128,
    pub max_ns: u64,
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            total: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < LINEAR {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros(); // >= SUB_BITS + 1
        let sub = (v >> (exp - SUB_BITS)) as usize & (SUB - 1);
        LINEAR as usize + (exp - SUB_BITS - 1) as usize * SUB + sub
    }

    /// The smallest value of bucket `i`.
    fn value(i: usize) -> u64 {
        if i < LINEAR as usize {
            return i as u64;
        }
        let k = i - LINEAR as usize;
        let exp = (k / SUB) as u32 + SUB_BITS + 1;
        let sub = (k % SUB) as u64;
        (1u64 << exp) | (sub << (exp - SUB_BITS))
    }

    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if let Some(c) = self.counts.get_mut(Self::index(ns)) {
            *c += 1;
        }
        self.total += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    pub fn mean_ns(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        self.sum_ns as f64 / self.total as f64
    }

    /// The value at quantile `q` (0..=1), as the upper end of its bucket.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        let rank = ((self.total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank && *c > 0 {
                return Self::value(i + 1).saturating_sub(1).min(self.max_ns);
            }
        }
        self.max_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_monotonic_and_precise() {
        let mut last = 0;
        for i in 1..BUCKETS {
            let v = Histogram::value(i);
            assert!(v > last, "bucket {i}");
            assert_eq!(Histogram::index(v), i);
            last = v;
        }
        let mut h = Histogram::new();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p99 = h.quantile_ns(0.99) as f64;
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.04, "{p99}");
        assert!((h.mean_ns() - 500_500.0).abs() < 1.0);
    }
}
