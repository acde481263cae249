//! Makes COMPARE AND WRITE atomic against ordinary writes without a lock on the write path.
//!
//! Ordinary writes bump an in-flight counter and, when no COMPARE AND WRITE is active, go
//! straight to the device. A COMPARE AND WRITE first announces itself (so new writes take the
//! slow path, which waits for overlapping CAWs), then waits for the fast-path writes already in
//! flight to drain. Both sides use sequentially consistent operations: a writer increments
//! `fast_writers` then reads `caws`; a CAW increments `caws` then reads `fast_writers`; at least
//! one of them sees the other.
//!
//! Not the same job as the export crate's `RangeLock` (an async, sharded, exclusive byte-range
//! lock for read-modify-write of unaligned NBD/FUSE requests): here ordinary writes never take
//! a lock unless a COMPARE AND WRITE is active, and the caller is synchronous.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicUsize, Ordering};

type Range = (u64, u64); // [start, end) in blocks

fn overlaps(a: Range, b: Range) -> bool {
    a.0 < b.1 && b.0 < a.1
}

#[derive(Default)]
struct Table {
    caws: Vec<Range>,
    slow_writers: Vec<Range>,
}

/// Coordination between COMPARE AND WRITE and other writes of one logical unit.
#[derive(Default)]
pub(crate) struct CawLocks {
    caws: AtomicUsize,
    fast_writers: AtomicUsize,
    table: Mutex<Table>,
    changed: Condvar,
}

/// Held by an ordinary write while it touches the device.
pub(crate) enum WriteGuard<'a> {
    Fast(&'a CawLocks),
    Slow(&'a CawLocks, Range),
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        match self {
            WriteGuard::Fast(l) => {
                l.fast_writers.fetch_sub(1, Ordering::SeqCst);
            }
            WriteGuard::Slow(l, r) => {
                let mut t = l.table.lock();
                if let Some(i) = t.slow_writers.iter().position(|x| x == r) {
                    t.slow_writers.swap_remove(i);
                }
                drop(t);
                l.changed.notify_all();
            }
        }
    }
}

/// Held by a COMPARE AND WRITE between its read and its write.
pub(crate) struct CawGuard<'a>(&'a CawLocks, Range);

impl Drop for CawGuard<'_> {
    fn drop(&mut self) {
        let mut t = self.0.table.lock();
        if let Some(i) = t.caws.iter().position(|x| *x == self.1) {
            t.caws.swap_remove(i);
        }
        self.0.caws.fetch_sub(1, Ordering::SeqCst);
        drop(t);
        self.0.changed.notify_all();
    }
}

impl CawLocks {
    /// Enters an ordinary write of blocks `[start, end)`.
    pub fn write(&self, start: u64, end: u64) -> WriteGuard<'_> {
        self.fast_writers.fetch_add(1, Ordering::SeqCst);
        if self.caws.load(Ordering::SeqCst) == 0 {
            return WriteGuard::Fast(self);
        }
        self.fast_writers.fetch_sub(1, Ordering::SeqCst);
        let r = (start, end);
        let mut t = self.table.lock();
        while t.caws.iter().any(|c| overlaps(*c, r)) {
            self.changed.wait(&mut t);
        }
        t.slow_writers.push(r);
        WriteGuard::Slow(self, r)
    }

    /// Enters an ordinary write unless a COMPARE AND WRITE is active (then `None`: the caller
    /// must not wait on this thread).
    pub fn try_write(&self, _start: u64, _end: u64) -> Option<WriteGuard<'_>> {
        self.fast_writers.fetch_add(1, Ordering::SeqCst);
        if self.caws.load(Ordering::SeqCst) == 0 {
            return Some(WriteGuard::Fast(self));
        }
        self.fast_writers.fetch_sub(1, Ordering::SeqCst);
        None
    }

    /// Enters a COMPARE AND WRITE of blocks `[start, end)`; returns once no other write can
    /// touch the range until the guard drops.
    pub fn compare_and_write(&self, start: u64, end: u64) -> CawGuard<'_> {
        let r = (start, end);
        let mut t = self.table.lock();
        while t
            .caws
            .iter()
            .chain(t.slow_writers.iter())
            .any(|c| overlaps(*c, r))
        {
            self.changed.wait(&mut t);
        }
        t.caws.push(r);
        self.caws.fetch_add(1, Ordering::SeqCst);
        drop(t);
        // Writes that entered the fast path before we announced ourselves finish quickly.
        while self.fast_writers.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        CawGuard(self, r)
    }
}
