//! Local applies of small writes without FUA, the bulk of a replicated LUN's local I/O: gathered
//! while the core task drains the core's actions, then written on that task itself when it has
//! nothing else to do (no thread hand-off) or handed to a local I/O thread as one batch.

use std::time::{Duration, Instant};

use replication::Token;

use crate::task::{Driver, Input};

/// Largest apply batched or tried on the core task itself (`Driver::flush_applies`): larger
/// ones each get a thread.
pub(crate) const INLINE_MAX: usize = 64 << 10;
/// An inline apply slower than this (wall time, so a preempted one counts too) ...
const INLINE_SLOW: Duration = Duration::from_millis(10);
/// ... sends applies to the local I/O threads for this long.
const INLINE_BACKOFF: Duration = Duration::from_secs(5);

impl Driver {
    /// Carry out the small applies gathered while draining: one alone with nothing else
    /// waiting for this task is written here (`apply_inline`); otherwise all of them go to a
    /// local I/O thread as one job, answered with one input, so a busy LUN pays two wake-ups
    /// per batch instead of per write. `true` when an inline apply completed (the core may
    /// have new actions).
    pub(crate) fn flush_applies(&mut self) -> bool {
        match self.batch.len() {
            0 => false,
            1 => {
                let Some((token, off, data)) = self.batch.pop() else {
                    return false;
                };
                if self.apply_inline(token, off, &data) {
                    return true;
                }
                let dev = self.local.clone();
                self.blocking(move || {
                    dev.write_at(&data, off)?;
                    Ok(Input::Applied(token))
                });
                false
            }
            _ => {
                let batch = std::mem::take(&mut self.batch);
                let dev = self.local.clone();
                self.blocking(move || {
                    let mut tokens = Vec::with_capacity(batch.len());
                    for (token, off, data) in batch {
                        dev.write_at(&data, off)?;
                        tokens.push(token);
                    }
                    Ok(Input::AppliedBatch(tokens))
                });
                false
            }
        }
    }

    /// Apply a small write without FUA on this task when nothing else waits for it: a
    /// buffered `pwrite` of a few KiB costs a few microseconds, less than the two thread
    /// hand-offs (there and back, each a wake-up) of a local I/O thread, which at low queue
    /// depths were most of a replicated write's latency on either node. With other inputs
    /// waiting the threads write while this task goes on. The kernel cannot say beforehand
    /// whether a buffered write will sleep (ext4 refuses `RWF_NOWAIT` for them), so one that
    /// took longer than [`INLINE_SLOW`] (dirty pages throttled, a journal commit awaited)
    /// sends the next [`INLINE_BACKOFF`] of applies to the threads: a slow disk holds up
    /// heartbeats and peer frames for one write at most. `false`: the write is the threads'.
    fn apply_inline(&mut self, token: Token, off: u64, data: &[u8]) -> bool {
        let started = Instant::now();
        let busy = !self.inputs.is_empty() || !self.link_rx.is_empty();
        if busy || self.inline_off_until.is_some_and(|t| started < t) {
            return false;
        }
        let result = self.local.write_at(data, off);
        let took = started.elapsed();
        if took > INLINE_SLOW {
            tracing::debug!(
                ?took,
                "a slow inline apply: the local I/O threads for a while"
            );
            self.inline_off_until = Some(started + took + INLINE_BACKOFF);
        }
        match result {
            Ok(()) => {
                let now = self.now();
                self.replica.apply_done(now, token);
            }
            // As a thread's failure: the next input stops the LUN.
            Err(e) => {
                self.local_io += 1;
                let _ = self.me.send(Input::LocalFailed(e.to_string()));
            }
        }
        true
    }
}
