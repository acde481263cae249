//! The per-request path selector: a pure function of a small slice of plain values plus one atomic
//! counter, so the I/O path takes no lock and allocates nothing.

use std::cmp::Ordering;
use std::sync::atomic::{self, AtomicU64};

use crate::path::PathView;
use crate::policy::Policy;

/// Chooses the path for each request according to a [`Policy`].
///
/// The only state is one rotating counter (an atomic, so `select` takes `&self` and a `Selector`
/// can be shared by every submitting task). It breaks ties so that equal paths alternate, drives
/// round robin, and indexes the interleaved weighted schedule. Under concurrent callers the
/// counter still hands out every turn exactly once, so the spread stays exact.
#[derive(Debug)]
pub struct Selector {
    policy: Policy,
    counter: AtomicU64,
}

impl Selector {
    pub fn new(policy: Policy) -> Selector {
        Selector {
            policy,
            counter: AtomicU64::new(0),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Index into `paths` of the path for a request of `bytes`, or `None` when no path is
    /// eligible. Only eligible paths of the best (lowest) tier present are candidates: ALUA
    /// optimized paths first, non-optimized only when no optimized path is eligible, tiers of
    /// [`TIER_NO_IO`](crate::TIER_NO_IO) and above never.
    ///
    /// Give the paths in `PathId` order: failover breaks priority ties by the lowest index, and
    /// [`PathSet`](crate::PathSet)'s failback gate assumes the same order.
    pub fn select(&self, paths: &[PathView], bytes: u32) -> Option<usize> {
        let tier = paths.iter().filter(|p| p.usable()).map(|p| p.tier).min()?;
        let candidate = |p: &PathView| p.usable() && p.tier == tier;
        match self.policy {
            Policy::ServiceTime => self.service_time(paths, bytes, candidate),
            Policy::QueueLength => self.min_rotating(paths, candidate, |a, b| {
                a.inflight_cmds.cmp(&b.inflight_cmds)
            }),
            Policy::RoundRobin | Policy::RoundRobinSubset { .. } => {
                let count = paths.iter().filter(|p| candidate(p)).count();
                let turn = self.tick() % count as u64;
                nth_candidate(paths, candidate, turn as usize)
            }
            Policy::Weighted => self.weighted(paths, candidate),
            Policy::Failover => {
                // max_by_key keeps the last maximum; iterate backwards so ties go to the lowest
                // index, which keeps failover deterministic.
                paths
                    .iter()
                    .enumerate()
                    .rev()
                    .filter(|(_, p)| candidate(p))
                    .max_by_key(|(_, p)| p.priority)
                    .map(|(i, _)| i)
            }
        }
    }

    fn tick(&self) -> u64 {
        self.counter.fetch_add(1, atomic::Ordering::Relaxed)
    }

    /// Least expected completion time: (inflight_bytes + bytes) / throughput, compared as
    /// cross products so no division and no floating point is needed; ties go to fewer
    /// commands in flight, then alternate.
    fn service_time(
        &self,
        paths: &[PathView],
        bytes: u32,
        candidate: impl Fn(&PathView) -> bool,
    ) -> Option<usize> {
        let (known_sum, known_count) = paths
            .iter()
            .filter(|p| candidate(p) && p.throughput > 0)
            .fold((0u128, 0u128), |(sum, n), p| {
                (sum + u128::from(p.throughput), n + 1)
            });
        // An unknown throughput counts as the mean of the known ones, so a path that has not
        // been measured yet is neither starved nor flooded; with none known all are equal.
        let unknown_as = known_sum.checked_div(known_count).unwrap_or(1).max(1);
        let rate = |p: &PathView| {
            if p.throughput > 0 {
                u128::from(p.throughput)
            } else {
                unknown_as
            }
        };
        let work = |p: &PathView| u128::from(p.inflight_bytes) + u128::from(bytes);
        // work(a)/rate(a) vs work(b)/rate(b) with both rates > 0; a u64 + u32 times a u64 fits
        // in u128.
        self.min_rotating(paths, candidate, |a, b| {
            (work(a) * rate(b))
                .cmp(&(work(b) * rate(a)))
                .then(a.inflight_cmds.cmp(&b.inflight_cmds))
        })
    }

    /// The candidate that is least by `order`; when several tie, each call takes the next of
    /// them in turn, so equal paths alternate exactly. The counter is only touched on a tie.
    fn min_rotating(
        &self,
        paths: &[PathView],
        candidate: impl Fn(&PathView) -> bool,
        order: impl Fn(&PathView, &PathView) -> Ordering,
    ) -> Option<usize> {
        let mut best: Option<&PathView> = None;
        let mut ties = 0u64;
        for p in paths.iter().filter(|p| candidate(p)) {
            match best.map(|b| order(p, b)) {
                None | Some(Ordering::Less) => {
                    best = Some(p);
                    ties = 1;
                }
                Some(Ordering::Equal) => ties += 1,
                Some(Ordering::Greater) => {}
            }
        }
        let best = best?;
        let turn = if ties > 1 { self.tick() % ties } else { 0 };
        let tied = |p: &PathView| candidate(p) && order(p, best) == Ordering::Equal;
        nth_candidate(paths, tied, turn as usize)
    }

    /// Interleaved weighted round robin from one counter: position `c mod W` (W = total weight)
    /// is scattered over `0..W` by multiplying with a stride coprime to W, close to W times the
    /// golden ratio, and the scattered position is looked up in the cumulative weights. Every W
    /// consecutive calls give each path exactly its weight, and consecutive calls land far apart,
    /// so a heavy path's turns are spread out instead of coming in one burst.
    fn weighted(&self, paths: &[PathView], candidate: impl Fn(&PathView) -> bool) -> Option<usize> {
        let weight = |p: &PathView| u64::from(p.weight.max(1));
        let total: u64 = paths.iter().filter(|p| candidate(p)).map(weight).sum();
        if total == 0 {
            return None;
        }
        let position = self.tick() % total;
        let stride = coprime_stride(total);
        let mut slot = (u128::from(position) * u128::from(stride) % u128::from(total)) as u64;
        for (i, p) in paths.iter().enumerate().filter(|(_, p)| candidate(p)) {
            let w = weight(p);
            if slot < w {
                return Some(i);
            }
            slot -= w;
        }
        None
    }
}

fn nth_candidate(
    paths: &[PathView],
    candidate: impl Fn(&PathView) -> bool,
    n: usize,
) -> Option<usize> {
    paths
        .iter()
        .enumerate()
        .filter(|(_, p)| candidate(p))
        .nth(n)
        .map(|(i, _)| i)
}

/// A stride near `total` x 0.618 that shares no factor with `total`, so multiplying by it permutes
/// `0..total`.
fn coprime_stride(total: u64) -> u64 {
    let mut stride = ((u128::from(total) * 618_034 / 1_000_000) as u64).max(1);
    while gcd(stride, total) != 1 {
        stride += 1;
    }
    stride
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
#[path = "select_tests.rs"]
mod tests;
