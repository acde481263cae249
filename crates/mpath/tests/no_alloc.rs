//! The hot path allocates nothing: `Selector::select` for every policy and `split` (any piece
//! count), checked with a counting global allocator.
#![allow(unsafe_code)] // a GlobalAlloc wrapper cannot be written without it

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use mpath::{split, PathView, Policy, Selector};

struct Counting;

thread_local! {
    // Per thread, so the test harness's own threads do not disturb the count.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call unchanged to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn select_and_split_do_not_allocate() {
    let paths: Vec<PathView> = (0..8u32)
        .map(|i| PathView {
            eligible: i != 3,
            tier: u8::from(i >= 6),
            inflight_bytes: u64::from(i) * 65536,
            inflight_cmds: i % 3,
            throughput: if i % 2 == 0 {
                0
            } else {
                100_000_000 * u64::from(i)
            },
            weight: i + 1,
            priority: i % 4,
        })
        .collect();
    let selectors: Vec<Selector> = [
        "service-time",
        "queue-length",
        "round-robin",
        "round-robin-subset",
        "weighted",
        "failover",
    ]
    .iter()
    .map(|name| Selector::new(name.parse::<Policy>().expect("policy name")))
    .collect();

    let before = allocations();
    let mut picked = 0usize;
    for selector in &selectors {
        for k in 0..1000u32 {
            picked += selector.select(&paths, 4096 * (k % 64)).unwrap_or(0);
        }
    }
    let mut covered = 0u64;
    for parts in 1..8 {
        for (_, len) in split(1 << 20, 8 << 20, parts, 4096, 128 << 10, 64 << 10) {
            covered += len;
        }
    }
    let after = allocations();
    assert_eq!(after - before, 0, "the hot path allocated");
    // Keep the work observable so none of it can be skipped.
    assert!(picked > 0);
    assert_eq!(covered, 7 * (8 << 20));
}
