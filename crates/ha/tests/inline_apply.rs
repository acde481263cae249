//! Where a LUN's plain applies run: small ones on the core's own task (no thread hand-off on
//! a write's critical path), large ones and any while the file system is slow on the LUN's
//! I/O threads, so the core (heartbeats, the peer link) never waits on a slow disk for long.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blockstore::{BlockDevice, Extent};
use parking_lot::Mutex;
use support::*;

/// A disk that notes the name of the thread of every write, and makes the next write slow
/// when told to.
struct Watched {
    inner: Arc<dyn BlockDevice>,
    threads: Mutex<Vec<String>>,
    slow_next: AtomicBool,
}

impl Watched {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.threads.lock())
    }
}

impl BlockDevice for Watched {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.threads.lock().push(name);
        if self.slow_next.swap(false, Ordering::SeqCst) {
            // A file system stalling this write (writeback throttling, a page read in).
            std::thread::sleep(Duration::from_millis(200));
        }
        self.inner.write_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        self.write_at(&bufs.concat(), offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.punch_hole(offset, len)
    }
    fn allocation_map(&self, offset: u64, len: u64) -> std::io::Result<Vec<Extent>> {
        self.inner.allocation_map(offset, len)
    }
}

fn on_io_threads(names: &[String]) -> usize {
    names
        .iter()
        .filter(|n| n.starts_with("lanes-ha-io"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_applies_run_on_the_core_until_the_disk_is_slow_and_large_ones_on_io_threads() {
    let made: Mutex<Vec<(usize, Arc<Watched>)>> = Mutex::new(Vec::new());
    let pair = Pair::wrapping(|n, inner| {
        let w = Arc::new(Watched {
            inner,
            threads: Mutex::new(Vec::new()),
            slow_next: AtomicBool::new(false),
        });
        made.lock().push((n, w.clone()));
        w
    });
    let mut made = made.into_inner();
    made.sort_by_key(|(n, _)| *n);
    let watched: Vec<Arc<Watched>> = made.into_iter().map(|(_, w)| w).collect();
    // Slow means 50 ms here, not the default 2: a test machine busy with other tests can
    // hold a thread off its core for milliseconds, which is not the disk stalling.
    let slow = |c: &mut lanes_ha::PairConfig| c.inline_slow = Duration::from_millis(50);
    let (a, b) = (pair.start_with(0, slow), pair.start_with(1, slow));
    paired([&a, &b]).await;
    for w in &watched {
        w.take();
    }

    // Small writes, one at a time: applied on each node's core task.
    for i in 0..8u64 {
        write(&a.dev, i * 3, pattern(i, 2 * BS as usize))
            .await
            .unwrap();
    }
    for (n, w) in watched.iter().enumerate() {
        let names = w.take();
        assert_eq!(names.len(), 8, "node {n}: {names:?}");
        assert_eq!(
            on_io_threads(&names),
            0,
            "node {n} used I/O threads: {names:?}"
        );
    }

    // Larger than one pass may write on the core: an I/O thread, on both nodes.
    write(&a.dev, 100, pattern(50, 64 * BS as usize))
        .await
        .unwrap();
    for (n, w) in watched.iter().enumerate() {
        let names = w.take();
        assert_eq!(on_io_threads(&names), names.len(), "node {n}: {names:?}");
        assert!(!names.is_empty(), "node {n} applied nothing");
    }

    // Node 1's disk stalls once: its next small applies go to the I/O threads, node 0's stay.
    watched[1].slow_next.store(true, Ordering::SeqCst);
    write(&a.dev, 300, pattern(60, BS as usize)).await.unwrap();
    watched[1].take();
    watched[0].take();
    for i in 0..8u64 {
        write(&a.dev, 400 + i, pattern(70 + i, BS as usize))
            .await
            .unwrap();
    }
    let (n0, n1) = (watched[0].take(), watched[1].take());
    assert_eq!(on_io_threads(&n0), 0, "node 0 used I/O threads: {n0:?}");
    assert_eq!(
        on_io_threads(&n1),
        8,
        "node 1 kept a slow disk on its core: {n1:?}"
    );

    // Every write is on both disks all the same.
    let [d0, d1] = pair.local_images();
    assert!(d0 == d1, "the disks differ");
    a.lun.shutdown().await;
    b.lun.shutdown().await;
}
