//! Tests of the selector: each policy by example, and properties over random path sets.

use super::*;
use crate::path::{TIER_NON_OPTIMIZED, TIER_NO_IO, TIER_OPTIMIZED};
use proptest::prelude::*;
use std::collections::VecDeque;

fn path() -> PathView {
    PathView {
        eligible: true,
        tier: TIER_OPTIMIZED,
        weight: 1,
        ..PathView::default()
    }
}

fn counts(selector: &Selector, paths: &[PathView], calls: usize) -> Vec<usize> {
    let mut counts = vec![0; paths.len()];
    for _ in 0..calls {
        counts[selector.select(paths, 4096).expect("a path")] += 1;
    }
    counts
}

const ALL: [Policy; 6] = [
    Policy::ServiceTime,
    Policy::QueueLength,
    Policy::RoundRobin,
    Policy::RoundRobinSubset { active: 2 },
    Policy::Weighted,
    Policy::Failover,
];

#[test]
fn selector_is_shareable() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Selector>();
}

#[test]
fn nothing_eligible_is_none() {
    for policy in ALL {
        let s = Selector::new(policy.clone());
        assert_eq!(s.select(&[], 512), None, "{policy}");
        let paths = [
            PathView {
                eligible: false,
                ..path()
            },
            PathView {
                tier: TIER_NO_IO,
                ..path()
            },
        ];
        assert_eq!(s.select(&paths, 512), None, "{policy}");
    }
}

#[test]
fn optimized_tier_first_non_optimized_as_fallback() {
    for policy in ALL {
        let s = Selector::new(policy.clone());
        let mut paths = [
            PathView {
                tier: TIER_NON_OPTIMIZED,
                priority: 9,
                weight: 9,
                ..path()
            },
            PathView {
                tier: TIER_OPTIMIZED,
                inflight_bytes: 1 << 30,
                inflight_cmds: 100,
                ..path()
            },
            PathView {
                tier: TIER_NO_IO,
                ..path()
            },
        ];
        for _ in 0..10 {
            assert_eq!(s.select(&paths, 512), Some(1), "{policy}");
        }
        paths[1].eligible = false;
        for _ in 0..10 {
            assert_eq!(s.select(&paths, 512), Some(0), "{policy}");
        }
    }
}

#[test]
fn round_robin_rotates_over_eligible_paths() {
    let s = Selector::new(Policy::RoundRobin);
    let paths = [
        path(),
        PathView {
            eligible: false,
            ..path()
        },
        path(),
        path(),
    ];
    let picks: Vec<_> = (0..6).map(|_| s.select(&paths, 512).unwrap()).collect();
    assert_eq!(picks, [0, 2, 3, 0, 2, 3]);
}

#[test]
fn weighted_is_proportional_and_interleaved() {
    let s = Selector::new(Policy::Weighted);
    let paths = [
        PathView {
            weight: 3,
            ..path()
        },
        PathView {
            weight: 1,
            ..path()
        },
    ];
    let picks: Vec<_> = (0..400).map(|_| s.select(&paths, 512).unwrap()).collect();
    assert_eq!(picks.iter().filter(|&&i| i == 0).count(), 300);
    // Smooth: the light path never waits more than one round of the heavy one.
    let longest_run = picks.split(|&i| i == 1).map(<[usize]>::len).max().unwrap();
    assert!(longest_run <= 3, "run of {longest_run} on the heavy path");
    // Zero weight counts as one.
    let paths = [
        PathView {
            weight: 0,
            ..path()
        },
        PathView {
            weight: 1,
            ..path()
        },
    ];
    assert_eq!(counts(&s, &paths, 100), [50, 50]);
}

#[test]
fn failover_takes_highest_priority_then_lowest_index() {
    let s = Selector::new(Policy::Failover);
    let mut paths = [
        PathView {
            priority: 1,
            ..path()
        },
        PathView {
            priority: 5,
            ..path()
        },
        PathView {
            priority: 5,
            ..path()
        },
    ];
    for _ in 0..5 {
        assert_eq!(s.select(&paths, 512), Some(1));
    }
    paths[1].eligible = false;
    assert_eq!(s.select(&paths, 512), Some(2));
    paths[2].eligible = false;
    assert_eq!(s.select(&paths, 512), Some(0));
}

#[test]
fn queue_length_takes_fewest_commands_and_alternates_ties() {
    let s = Selector::new(Policy::QueueLength);
    let paths = [
        PathView {
            inflight_cmds: 4,
            ..path()
        },
        PathView {
            inflight_cmds: 2,
            inflight_bytes: 1 << 30,
            ..path()
        },
        PathView {
            inflight_cmds: 3,
            ..path()
        },
    ];
    for _ in 0..5 {
        assert_eq!(s.select(&paths, 512), Some(1));
    }
    let tied = [
        path(),
        path(),
        PathView {
            inflight_cmds: 1,
            ..path()
        },
    ];
    assert_eq!(counts(&s, &tied, 100), [50, 50, 0]);
}

#[test]
fn service_time_weighs_bytes_by_throughput() {
    let s = Selector::new(Policy::ServiceTime);
    // 1 MiB queued at 100 MB/s (10 ms) beats 600 KiB queued at 50 MB/s (12 ms).
    let paths = [
        PathView {
            inflight_bytes: 1 << 20,
            throughput: 100_000_000,
            ..path()
        },
        PathView {
            inflight_bytes: 600 << 10,
            throughput: 50_000_000,
            ..path()
        },
    ];
    assert_eq!(s.select(&paths, 4096), Some(0));
    // The request's own size counts: an idle slow path loses to a barely busy fast one only
    // when the request is large.
    let paths = [
        PathView {
            inflight_bytes: 64 << 10,
            throughput: 1_000_000_000,
            ..path()
        },
        PathView {
            inflight_bytes: 0,
            throughput: 100_000_000,
            ..path()
        },
    ];
    assert_eq!(s.select(&paths, 4096), Some(1));
    assert_eq!(s.select(&paths, 1 << 20), Some(0));
}

#[test]
fn service_time_unknown_throughput_counts_as_mean() {
    let s = Selector::new(Policy::ServiceTime);
    // Known: 100 and 300 MB/s, mean 200 MB/s for the unknown one; 300 KB queued on it (1.5 ms)
    // beats 200 KB at 100 MB/s (2 ms) and loses to 300 KB at 300 MB/s (1 ms).
    let paths = [
        PathView {
            inflight_bytes: 200_000,
            throughput: 100_000_000,
            ..path()
        },
        PathView {
            inflight_bytes: 300_000,
            throughput: 0,
            ..path()
        },
        PathView {
            inflight_bytes: 300_000,
            throughput: 300_000_000,
            ..path()
        },
    ];
    assert_eq!(s.select(&paths, 0), Some(2));
    let mut fast_busy = paths;
    fast_busy[2].inflight_bytes = 900_000; // 3 ms
    assert_eq!(s.select(&fast_busy, 0), Some(1));
    // With no throughput known at all, bytes alone decide.
    let unknown = [
        PathView {
            throughput: 0,
            ..paths[0]
        },
        PathView {
            throughput: 0,
            ..paths[1]
        },
    ];
    assert_eq!(s.select(&unknown, 0), Some(0));
}

#[test]
fn service_time_ties_by_commands_then_alternate() {
    let s = Selector::new(Policy::ServiceTime);
    let paths = [
        PathView {
            inflight_cmds: 2,
            ..path()
        },
        PathView {
            inflight_cmds: 1,
            ..path()
        },
        PathView {
            inflight_cmds: 1,
            ..path()
        },
    ];
    assert_eq!(counts(&s, &paths, 100), [0, 50, 50]);
    // All unknown throughput and idle: equal, so they alternate.
    assert_eq!(counts(&s, &[path(), path()], 100), [50, 50]);
}

/// Drives the selector against paths that drain their queues at fixed rates, keeping `depth`
/// requests of `size` bytes in flight, and returns the requests each path got.
fn simulate(selector: &Selector, rates: &[u64], depth: usize, size: u64, steps: usize) -> Vec<u64> {
    let mut queues: Vec<VecDeque<u64>> = vec![VecDeque::new(); rates.len()];
    let mut sent = vec![0u64; rates.len()];
    for _ in 0..steps {
        // Refill to the queue depth.
        while queues.iter().map(VecDeque::len).sum::<usize>() < depth {
            let views: Vec<PathView> = queues
                .iter()
                .zip(rates)
                .map(|(q, &rate)| PathView {
                    inflight_bytes: q.iter().sum(),
                    inflight_cmds: q.len() as u32,
                    throughput: rate,
                    ..path()
                })
                .collect();
            let i = selector.select(&views, size as u32).unwrap();
            queues[i].push_back(size);
            sent[i] += 1;
        }
        // One time unit: each path drains `rate` bytes (per unit) from the head of its queue.
        for (q, &rate) in queues.iter_mut().zip(rates) {
            let mut budget = rate;
            while let Some(head) = q.front_mut() {
                let take = budget.min(*head);
                *head -= take;
                budget -= take;
                if *head == 0 {
                    q.pop_front();
                } else {
                    break;
                }
            }
        }
    }
    sent
}

#[test]
fn service_time_sends_more_to_faster_path() {
    let s = Selector::new(Policy::ServiceTime);
    let sent = simulate(&s, &[200, 100], 8, 64, 2000);
    let ratio = sent[0] as f64 / sent[1] as f64;
    assert!((1.7..2.3).contains(&ratio), "{sent:?}");
}

#[test]
fn coprime_stride_permutes() {
    for total in 1..200u64 {
        let stride = coprime_stride(total);
        let mut seen = vec![false; total as usize];
        for p in 0..total {
            seen[(p * stride % total) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s), "total {total} stride {stride}");
    }
}

fn arb_view() -> impl Strategy<Value = PathView> {
    (
        any::<bool>(),
        0u8..4,
        0u64..1 << 40,
        0u32..64,
        0u64..1 << 34,
        0u32..8,
        0u32..4,
    )
        .prop_map(
            |(eligible, tier, inflight_bytes, inflight_cmds, throughput, weight, priority)| {
                PathView {
                    eligible,
                    tier,
                    inflight_bytes,
                    inflight_cmds,
                    throughput,
                    weight,
                    priority,
                }
            },
        )
}

fn arb_policy() -> impl Strategy<Value = Policy> {
    prop::sample::select(ALL.to_vec())
}

proptest! {
    #[test]
    fn select_picks_eligible_path_of_best_tier(
        policy in arb_policy(),
        paths in prop::collection::vec(arb_view(), 0..8),
        bytes in any::<u32>(),
        warmup in 0usize..10,
    ) {
        let s = Selector::new(policy);
        for _ in 0..warmup {
            s.select(&paths, bytes);
        }
        let best = paths.iter().filter(|p| p.eligible && p.tier < TIER_NO_IO).map(|p| p.tier).min();
        match s.select(&paths, bytes) {
            None => prop_assert_eq!(best, None),
            Some(i) => {
                let p = paths[i];
                prop_assert!(p.eligible);
                prop_assert_eq!(Some(p.tier), best);
            }
        }
    }

    #[test]
    fn round_robin_spreads_evenly(n in 1usize..8, rounds in 1usize..50) {
        let s = Selector::new(Policy::RoundRobin);
        let paths = vec![path(); n];
        let c = counts(&s, &paths, n * rounds);
        prop_assert!(c.iter().all(|&k| k == rounds), "{:?}", c);
    }

    #[test]
    fn weighted_spreads_by_weight(weights in prop::collection::vec(1u32..20, 1..6), rounds in 1usize..20) {
        let s = Selector::new(Policy::Weighted);
        let paths: Vec<_> = weights.iter().map(|&weight| PathView { weight, ..path() }).collect();
        let total: u32 = weights.iter().sum();
        // A few extra calls so the window does not start at the schedule's beginning.
        let extra = 7;
        let c = counts(&s, &paths, total as usize * rounds + extra);
        for (k, w) in c.iter().zip(&weights) {
            let expect = (*w as usize) * rounds;
            prop_assert!(k.abs_diff(expect) <= extra, "{:?} vs weights {:?}", c, weights);
        }
    }

    #[test]
    fn service_time_favours_throughput(slow in 20u64..200, factor in 2u64..5) {
        let s = Selector::new(Policy::ServiceTime);
        let sent = simulate(&s, &[slow, slow * factor], 8, 64, 500);
        prop_assert!(sent[1] > sent[0], "{:?}", sent);
    }
}

#[test]
fn concurrent_callers_share_the_turns_exactly() {
    let s = Selector::new(Policy::RoundRobin);
    let paths = [path(), path(), path(), path()];
    let per_thread = 10_000;
    let totals = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| counts(&s, &paths, per_thread)))
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .fold(vec![0; 4], |mut acc, c| {
                acc.iter_mut().zip(c).for_each(|(a, c)| *a += c);
                acc
            })
    });
    assert_eq!(totals, [per_thread; 4]);
}
