//! Host writes that hold every thread of tokio's blocking pool while they wait for the pair, as
//! the iSCSI target's commands do (one blocking thread per WRITE when the write cache is off):
//! the replicated LUN's own local I/O must not need that pool, or nothing moves again.

mod support;

use std::time::Duration;

use support::*;

/// Blocking threads of the runtime: fewer than the writes in flight.
const THREADS: usize = 4;
const WRITES: u64 = 16;
const BLOCKS_PER_WRITE: u64 = 8;

#[test]
fn writes_holding_every_blocking_thread_still_complete() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(THREADS)
        .build()
        .unwrap();
    let pair = Pair::new();
    let completed = runtime.block_on(async {
        let (a, b) = (pair.start(0), pair.start(1));
        paired([&a, &b]).await;
        // One runtime thread and no await until every write is spawned: the first THREADS
        // writes take every blocking thread before the core task sees any of them, so the
        // local applies it asks for come after all of them.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..WRITES {
            let (dev, tx) = (a.dev.clone(), tx.clone());
            tokio::task::spawn_blocking(move || {
                let data = pattern(i, (BLOCKS_PER_WRITE * BS) as usize);
                let result = dev.write_at(&data, i * BLOCKS_PER_WRITE * BS);
                let _ = tx.send(result.map_err(|e| e.to_string()));
            });
        }
        drop(tx);
        let mut completed = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(r) = rx.recv().await {
                completed.push(r);
            }
        })
        .await;
        if completed.len() as u64 == WRITES {
            a.lun.shutdown().await;
            b.lun.shutdown().await;
        }
        completed
    });
    // Writes still waiting cannot hold the test: their threads are left behind.
    runtime.shutdown_timeout(Duration::from_secs(1));
    assert_eq!(
        completed.len() as u64,
        WRITES,
        "only {} of {WRITES} writes completed with {THREADS} blocking threads",
        completed.len()
    );
    for r in &completed {
        assert!(r.is_ok(), "a write failed: {r:?}");
    }
    let [d0, d1] = pair.local_images();
    for i in 0..WRITES {
        let at = (i * BLOCKS_PER_WRITE * BS) as usize;
        let want = pattern(i, (BLOCKS_PER_WRITE * BS) as usize);
        let end = at + want.len();
        assert!(d0[at..end] == want[..], "node 0 lacks write {i}");
        assert!(d1[at..end] == want[..], "node 1 lacks write {i}");
    }
}
