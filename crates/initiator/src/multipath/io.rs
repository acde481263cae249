//! The request path of a multipath device: pick a path with the selector (atomics only, no
//! lock), run the command there, and when the path fails under it, replay it elsewhere. A
//! write from a failed path is replayed only after the target can no longer execute the old
//! copy (the path's session is fenced), so a stale write never lands after a newer one.

use bytes::Bytes;
use mpath::PathView;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Inner, MAX_PATHS};
use crate::{Error, Session};

/// How often one request may move to another path before it gives up.
const MAX_ATTEMPTS: u32 = 64;
/// Retries of BUSY / TASK SET FULL / TASK ABORTED before the status reaches the caller.
const MAX_BUSY_RETRIES: u32 = 100;

/// One SCSI operation of the device, by what it does to the medium.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Read { lba: u64, blocks: u32 },
    Write { lba: u64, data: Bytes, fua: bool },
    Flush,
    Unmap { lba: u64, blocks: u32 },
    Zero { lba: u64, blocks: u32, unmap: bool },
}

impl Op {
    fn bytes(&self, block_size: u32) -> u32 {
        match self {
            Op::Read { blocks, .. } => blocks.saturating_mul(block_size),
            Op::Write { data, .. } => u32::try_from(data.len()).unwrap_or(u32::MAX),
            Op::Flush | Op::Unmap { .. } | Op::Zero { .. } => 0,
        }
    }

    /// Whether the operation changes the medium, so a copy on a failed path must be fenced
    /// before it is replayed.
    fn modifies(&self) -> bool {
        !matches!(self, Op::Read { .. } | Op::Flush)
    }

    async fn run(&self, s: &Session) -> Result<Bytes, Error> {
        match self {
            Op::Read { lba, blocks } => s.read(*lba, *blocks).await,
            Op::Write { lba, data, fua } => s
                .write_fua(*lba, data.clone(), *fua)
                .await
                .map(|_| Bytes::new()),
            Op::Flush => s.synchronize_cache().await.map(|_| Bytes::new()),
            Op::Unmap { lba, blocks } => s.unmap(*lba, *blocks).await.map(|_| Bytes::new()),
            Op::Zero { lba, blocks, unmap } => s
                .write_zeroes(*lba, *blocks, *unmap)
                .await
                .map(|_| Bytes::new()),
        }
    }
}

/// What a SCSI status means for the multipath layer.
enum Verdict {
    /// The LUN's own answer: give it to the caller.
    Final,
    /// ALUA: the path's port group cannot take I/O now; re-read the states, try another path.
    AluaTransition,
    /// BUSY or TASK SET FULL: try again shortly.
    Busy,
    /// TASK ABORTED: task management from another I_T nexus (a reset another host or path
    /// sent) ended the command; it did all or nothing, so it is sent again.
    Aborted,
}

fn classify(e: &Error) -> Verdict {
    match e {
        Error::Scsi {
            status: 0x08 | 0x28,
            ..
        } => Verdict::Busy,
        Error::Scsi { status: 0x40, .. } => Verdict::Aborted,
        // NOT READY, 04/0A transitioning, 04/0B standby, 04/0C unavailable (SPC-4 5.16.2).
        Error::Scsi {
            sense: Some((0x02, 0x04, 0x0a..=0x0c)),
            ..
        } => Verdict::AluaTransition,
        _ => Verdict::Final,
    }
}

impl Inner {
    /// Ends a command's accounting on `slot`, and wakes a quiescing fence when the device
    /// has nothing left in flight.
    fn end_on(&self, slot: &super::slot::PathSlot, bytes: u32) {
        if slot.end(bytes) && self.paused.load(Ordering::SeqCst) {
            self.idle.notify_waiters();
        }
    }

    /// Waits while the device is paused by a fence.
    async fn wait_resumed(&self) {
        loop {
            let resumed = self.resume.notified();
            tokio::pin!(resumed);
            resumed.as_mut().enable();
            if !self.paused.load(Ordering::SeqCst) {
                return;
            }
            resumed.await;
        }
    }

    /// The selector's choice among the paths, from their atomic counters.
    fn pick(&self, bytes: u32) -> Option<usize> {
        let mut views = [PathView::default(); MAX_PATHS];
        let n = self.slots.len().min(MAX_PATHS);
        for (v, s) in views.iter_mut().zip(&self.slots) {
            *v = s.view();
        }
        self.selector.select(views.get(..n)?, bytes)
    }

    /// Waits until some path may take I/O, up to the no-path timeout counted from `since`.
    async fn wait_for_path(&self, since: Instant, bytes: u32) -> Result<usize, Error> {
        loop {
            let notified = self.path_change.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(i) = self.pick(bytes) {
                return Ok(i);
            }
            if self.closing.load(Ordering::Relaxed) {
                return Err(Error::NoPath { secs: 0 });
            }
            let left = self
                .config
                .no_path_timeout
                .checked_sub(since.elapsed())
                .ok_or(Error::NoPath {
                    secs: self.config.no_path_timeout.as_secs(),
                })?;
            let _ = tokio::time::timeout(left, notified).await;
        }
    }

    /// Runs `op` on the best path, replaying it on others until it completes or no path is left.
    pub(crate) async fn submit(&self, op: Op) -> Result<Bytes, Error> {
        let bytes = op.bytes(self.block_size);
        let mut waiting_since: Option<Instant> = None;
        let mut busy = 0u32;
        let mut last = String::new();
        let mut failures = 0u32;
        while failures < MAX_ATTEMPTS {
            let index = match self.pick(bytes) {
                Some(i) => i,
                None => {
                    let since = *waiting_since.get_or_insert_with(Instant::now);
                    self.wait_for_path(since, bytes).await?
                }
            };
            let Some(slot) = self.slots.get(index) else {
                continue;
            };
            let Some((session, epoch)) = slot.current() else {
                // Lost between the pick and now: make sure the next pick does not choose it
                // (the health task makes it eligible again once it has a session).
                slot.eligible.store(false, Ordering::Relaxed);
                continue;
            };
            slot.begin(bytes);
            if self.paused.load(Ordering::SeqCst) {
                // A fence is quiescing the device: step back and wait for it.
                self.end_on(slot, bytes);
                self.wait_resumed().await;
                continue;
            }
            let start = Instant::now();
            let result =
                tokio::time::timeout(self.config.health.command_timeout, op.run(&session)).await;
            self.end_on(slot, bytes);
            let reason = match result {
                Ok(Ok(data)) => {
                    // One clock read serves the latency and the path's last-contact stamp.
                    let done = Instant::now();
                    slot.stats.record(done - start, bytes);
                    let at = u64::try_from((done - self.started).as_nanos()).unwrap_or(u64::MAX);
                    slot.last_completion.fetch_max(at, Ordering::Relaxed);
                    return Ok(data);
                }
                Ok(Err(e)) if !e.is_path_error() => match classify(&e) {
                    Verdict::Final => {
                        slot.stats.record(start.elapsed(), bytes);
                        return Err(e);
                    }
                    Verdict::Busy if busy < MAX_BUSY_RETRIES => {
                        busy += 1;
                        // A real back-off: the target asked us to come back later.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        continue;
                    }
                    Verdict::Busy => return Err(e),
                    Verdict::Aborted if busy < MAX_BUSY_RETRIES => {
                        busy += 1;
                        self.replayed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Verdict::Aborted => return Err(e),
                    Verdict::AluaTransition => {
                        slot.eligible.store(false, Ordering::Relaxed);
                        self.refresh_alua.notify_one();
                        continue;
                    }
                },
                Ok(Err(e)) => crate::chain(&e),
                Err(_) => format!(
                    "a command got no answer within {} ms",
                    self.config.health.command_timeout.as_millis()
                ),
            };
            slot.stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(path = %slot.id, epoch, "command failed with its path: {reason}");
            last.clone_from(&reason);
            failures += 1;
            self.fail_path(index, epoch, reason, true);
            if op.modifies() {
                let since = *waiting_since.get_or_insert_with(Instant::now);
                self.wait_fenced(index, epoch, since).await?;
            }
            self.replayed.fetch_add(1, Ordering::Relaxed);
        }
        Err(Error::Protocol(format!(
            "a command failed on {MAX_ATTEMPTS} paths in a row; the last said: {last}"
        )))
    }

    /// Waits until the target has ended the session of `epoch` on path `index`.
    async fn wait_fenced(&self, index: usize, epoch: u64, since: Instant) -> Result<(), Error> {
        let Some(slot) = self.slots.get(index) else {
            return Ok(());
        };
        let mut rx = slot.fenced.subscribe();
        let left = self.config.no_path_timeout.saturating_sub(since.elapsed());
        let fenced = tokio::time::timeout(left, rx.wait_for(|f| *f >= epoch))
            .await
            .is_ok_and(|r| r.is_ok());
        if fenced {
            Ok(())
        } else {
            Err(Error::NoPath {
                secs: self.config.no_path_timeout.as_secs(),
            })
        }
    }
}
