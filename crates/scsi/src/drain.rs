//! Waiting out the commands already under way on a logical unit, for a reset made through
//! another target of the same logical unit (another gateway over one RBD image): once the
//! reset's unit attention is raised here, every command that has not yet passed its unit
//! attention check will get it instead of running; the drain waits for the ones that had,
//! so that after it nothing sent to this target before the reset can still reach the storage.
//!
//! Lock-free on the command path: a command enters the current of two epochs (one atomic
//! load and one increment, the decrement when it ends); a drain flips the epoch and waits for
//! the old one to empty.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Debug, Default)]
pub(crate) struct Drain {
    epoch: AtomicUsize,
    active: [AtomicU64; 2],
    /// One drain at a time (each leaves the epoch it flipped away from empty).
    draining: Mutex<()>,
}

/// A command under way; leaves its epoch when dropped.
pub(crate) struct Ticket<'a> {
    drain: &'a Drain,
    slot: usize,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if let Some(a) = self.drain.active.get(self.slot) {
            a.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// [`Ticket`] for a command that outlives the call that began it (asynchronous I/O).
pub(crate) struct OwnedTicket {
    drain: std::sync::Arc<Drain>,
    slot: usize,
}

impl Drop for OwnedTicket {
    fn drop(&mut self) {
        if let Some(a) = self.drain.active.get(self.slot) {
            a.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drain {
    /// [`Drain::enter`] with a ticket that holds the drain itself.
    pub(crate) fn enter_owned(self: &std::sync::Arc<Self>) -> OwnedTicket {
        let slot = self.epoch.load(Ordering::SeqCst) & 1;
        if let Some(a) = self.active.get(slot) {
            a.fetch_add(1, Ordering::SeqCst);
        }
        OwnedTicket {
            drain: self.clone(),
            slot,
        }
    }

    /// A command starts (before its unit attention check).
    pub(crate) fn enter(&self) -> Ticket<'_> {
        let slot = self.epoch.load(Ordering::SeqCst) & 1;
        if let Some(a) = self.active.get(slot) {
            a.fetch_add(1, Ordering::SeqCst);
        }
        Ticket { drain: self, slot }
    }

    /// Commands under way now (either epoch): a hint, not a synchronization.
    pub(crate) fn under_way(&self) -> u64 {
        self.active.iter().map(|a| a.load(Ordering::Relaxed)).sum()
    }

    /// Waits until every command that entered before this call has ended, at most `timeout`;
    /// false when some are still running then.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let Some(_one) = self.draining.try_lock_until(deadline) else {
            return false;
        };
        let current = self.epoch.load(Ordering::SeqCst) & 1;
        // Commands left in the other epoch by an earlier drain that gave up entered before
        // this one too: they must end before new commands go there.
        if !self.empty(current ^ 1, deadline) {
            return false;
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.empty(current, deadline)
    }

    fn empty(&self, slot: usize, deadline: Instant) -> bool {
        let Some(active) = self.active.get(slot) else {
            return true;
        };
        while active.load(Ordering::SeqCst) != 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_drain_waits_for_every_command_begun_before_it() {
        let d = Arc::new(Drain::default());
        let before = d.enter();
        assert!(!d.wait(Duration::from_millis(20)), "`before` is running");
        // That drain gave up after moving new commands to the other epoch.
        let after = d.enter();
        drop(after);
        assert!(
            !d.wait(Duration::from_millis(20)),
            "`before` is still running, whatever epoch it entered"
        );
        drop(before);
        assert!(d.wait(Duration::from_millis(500)), "nothing is running");
        let during = d.enter();
        let d2 = d.clone();
        let waiter = std::thread::spawn(move || d2.wait(Duration::from_secs(10)));
        drop(during);
        assert!(waiter.join().unwrap());
        // Commands come and go between drains without holding them up.
        for _ in 0..3 {
            drop(d.enter());
            assert!(d.wait(Duration::from_millis(500)));
        }
    }
}
