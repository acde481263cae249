//! An async byte-range lock: writes that touch the same blocks run one after another, so a
//! read-modify-write of an edge block never loses a concurrent writer's bytes.
//!
//! The device is cut into 1 MiB stripes spread over 16 shards (stripe number modulo 16), each
//! a short mutex over the ranges held in it. Two overlapping ranges share a byte, hence a
//! stripe, hence a shard, where the second one sees the first. A range registers in every
//! shard its stripes map to, in ascending shard order; a waiter only ever waits for holders of
//! the shard it is entering, and holders acquire shards in ascending order, so waits cannot
//! form a cycle. Small writes touch one shard: there is no lock shared by all I/O.
//!
//! The scsi crate's `CawLocks` is a different tool (COMPARE AND WRITE against lock-free ordinary
//! writes, synchronous), so the two stay apart.

use std::future::Future;

use parking_lot::Mutex;
use tokio::sync::Notify;

const SHARDS: usize = 16;
const STRIPE_SHIFT: u32 = 20;

#[derive(Debug, Default)]
struct Shard {
    /// Held ranges, `[start, end)` in bytes. Few at a time (bounded by the requests in flight).
    held: Mutex<Vec<(u64, u64)>>,
    released: Notify,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct RangeLock {
    shards: [Shard; SHARDS],
}

/// Holds a range until dropped (also when the locking future is dropped half-way).
#[derive(Debug)]
pub(crate) struct RangeGuard<'a> {
    lock: &'a RangeLock,
    start: u64,
    end: u64,
    /// Bit `i` set: the range is registered in shard `i`.
    registered: u32,
}

impl RangeLock {
    /// Waits until no other guard overlaps `[start, end)`, then holds it. An empty range is
    /// granted at once.
    pub(crate) fn lock(&self, start: u64, end: u64) -> impl Future<Output = RangeGuard<'_>> {
        let mut guard = RangeGuard {
            lock: self,
            start,
            end,
            registered: 0,
        };
        async move {
            for index in shard_indices(start, end) {
                let Some(shard) = self.shards.get(index) else {
                    continue;
                };
                loop {
                    let released = shard.released.notified();
                    tokio::pin!(released);
                    // Registered for wake-ups before looking, so a release between the look
                    // and the await is not missed.
                    released.as_mut().enable();
                    {
                        let mut held = shard.held.lock();
                        if !held.iter().any(|&(s, e)| s < end && start < e) {
                            held.push((start, end));
                            guard.registered |= 1 << index;
                            break;
                        }
                    }
                    released.await;
                }
            }
            guard
        }
    }
}

/// The shards a range's stripes map to, ascending, without repeats.
fn shard_indices(start: u64, end: u64) -> impl Iterator<Item = usize> {
    let mut mask = 0u32;
    if start < end {
        let first = start >> STRIPE_SHIFT;
        let last = (end - 1) >> STRIPE_SHIFT;
        if last - first >= SHARDS as u64 {
            mask = u32::MAX;
        } else {
            for stripe in first..=last {
                mask |= 1 << (stripe % SHARDS as u64);
            }
        }
    }
    (0..SHARDS).filter(move |i| mask & (1 << i) != 0)
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        for (index, shard) in self.lock.shards.iter().enumerate() {
            if self.registered & (1 << index) == 0 {
                continue;
            }
            {
                let mut held = shard.held.lock();
                if let Some(pos) = held.iter().position(|&r| r == (self.start, self.end)) {
                    held.swap_remove(pos);
                }
            }
            shard.released.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn shards_cover_stripes() {
        assert_eq!(shard_indices(0, 0).count(), 0);
        assert_eq!(shard_indices(0, 1).collect::<Vec<_>>(), vec![0]);
        assert_eq!(
            shard_indices((1 << 20) - 1, (1 << 20) + 1).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(
            shard_indices(15 << 20, 17 << 20).collect::<Vec<_>>(),
            vec![0, 15]
        );
        assert_eq!(shard_indices(0, 64 << 20).count(), SHARDS);
    }

    #[tokio::test]
    async fn overlapping_ranges_wait_disjoint_do_not() {
        let lock = Arc::new(RangeLock::default());
        let held = lock.lock(4096, 8192).await;
        // Disjoint: granted although the first is held.
        let other = lock.lock(8192, 12288).await;
        drop(other);
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let lock2 = lock.clone();
        let waiter = tokio::spawn(async move {
            let _g = lock2.lock(0, 4097).await;
            tx.send(()).ok();
        });
        // The overlapping waiter cannot get in while `held` lives.
        assert!(tokio::time::timeout(Duration::from_millis(50), &mut rx)
            .await
            .is_err());
        drop(held);
        rx.await.unwrap();
        waiter.await.unwrap();
    }

    #[tokio::test]
    async fn dropped_waiter_releases_its_shards() {
        let lock = RangeLock::default();
        let held = lock.lock(1 << 20, (1 << 20) + 10).await;
        // Spans shards 0 and 1: registers in 0, then waits in 1; dropping it must undo 0.
        let pending = lock.lock(0, (1 << 20) + 5);
        assert!(tokio::time::timeout(Duration::from_millis(20), pending)
            .await
            .is_err());
        let _again = tokio::time::timeout(Duration::from_secs(5), lock.lock(0, 10))
            .await
            .expect("shard 0 was released by the dropped waiter");
        drop(held);
    }
}
