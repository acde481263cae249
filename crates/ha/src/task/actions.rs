//! Carrying out the core's actions: frames to the peer link, applies to the local I/O
//! threads, metadata to the journal, races to the witness, answers to the hosts.

use super::*;

/// Most plain applies one pass writes on the core's task itself (see `apply_batch`).
const INLINE_COUNT: usize = 1;
/// Most bytes of plain applies one pass writes on the core's task itself.
const INLINE_BYTES: usize = 128 * 1024;
/// A pass of applies on the core's task slower than `inline_slow` sends the passes after it
/// to the I/O threads for this long.
const INLINE_PAUSE: Duration = Duration::from_secs(5);

impl Driver {
    /// Carry out this pass's plain applies. A lone small one (a write at low queue depth) is
    /// written here, on the core's own task: a buffered write of a few blocks into the page
    /// cache takes microseconds, and a hand-off to an I/O thread and back costs two thread
    /// wake-ups on the write's critical path (on the peer, between receiving the frame and
    /// acknowledging it). Several (a loaded LUN), a large one, or any while the file system has
    /// lately been slow to take them ([`crate::PairConfig::inline_slow`]) go to one local I/O
    /// thread together, while the core goes on with the next inputs: the writes would
    /// serialize on the backing file's inode lock anyway, and one wake-up serves them all;
    /// each reports on its own as it completes, so the first is not held back by the last.
    ///
    /// Returns whether applies completed here (the core then has actions to carry out).
    pub(super) fn apply_batch(&mut self) -> bool {
        if self.applies.is_empty() {
            return false;
        }
        let batch = std::mem::take(&mut self.applies);
        if self.io.is_none() {
            return false;
        }
        let bytes: usize = batch.iter().map(|(_, _, d)| d.len()).sum();
        let inline_ok = self.inline_off_until.is_none_or(|t| Instant::now() >= t);
        if inline_ok && batch.len() <= INLINE_COUNT && bytes <= INLINE_BYTES {
            self.apply_here(batch);
            return true;
        }
        let Some(io) = &self.io else {
            return false;
        };
        self.local_io += batch.len();
        let (dev, me) = (self.local.clone(), self.me.clone());
        io.run(Box::new(move || {
            let mut failed: Option<String> = None;
            for (token, off, data) in batch {
                if failed.is_none() {
                    match catch_unwind(AssertUnwindSafe(|| dev.write_at(&data, off))) {
                        Ok(Ok(())) => {
                            let _ = me.send(Input::Applied(token));
                            continue;
                        }
                        Ok(Err(e)) => failed = Some(e.to_string()),
                        Err(_) => failed = Some("local I/O panicked".into()),
                    }
                }
                // Every apply of the batch reports, so the count of local I/O under way
                // (which a stop waits for) reaches zero.
                let e = failed.clone().unwrap_or_default();
                let _ = me.send(Input::LocalFailed(e));
            }
        }));
        false
    }

    /// Write `batch` on this task and tell the core at once. A failure is reported as a
    /// local I/O failure would be from a thread (the LUN stops); a pass that took longer than
    /// `inline_slow` (writeback throttling, a page read in) sends the next passes to the
    /// I/O threads for [`INLINE_PAUSE`], so heartbeats and the peer link never wait on a slow
    /// file system for long.
    fn apply_here(&mut self, batch: Vec<(Token, u64, Bytes)>) {
        let started = Instant::now();
        let mut failed: Option<String> = None;
        for (token, off, data) in batch {
            if failed.is_none() {
                match catch_unwind(AssertUnwindSafe(|| self.local.write_at(&data, off))) {
                    Ok(Ok(())) => {
                        let now = self.now();
                        self.replica.apply_done(now, token);
                        continue;
                    }
                    Ok(Err(e)) => failed = Some(e.to_string()),
                    Err(_) => failed = Some("local I/O panicked".into()),
                }
            }
        }
        if let Some(e) = failed {
            // Through the inputs, as a thread's failure comes: the run loop stops the LUN.
            self.local_io += 1;
            let _ = self.me.send(Input::LocalFailed(e));
        }
        let took = started.elapsed();
        if took > self.inline_slow {
            tracing::debug!(
                ?took,
                "local applies were slow: sending them to the I/O threads for a while"
            );
            self.inline_off_until = Some(Instant::now() + INLINE_PAUSE);
        }
    }

    /// Reads `blocks` blocks at `lba` on a local I/O thread; `done` makes the core's input of
    /// what was read.
    fn read_local(
        &mut self,
        lba: u64,
        blocks: u32,
        done: impl FnOnce(Bytes) -> Input + Send + 'static,
    ) {
        let (dev, off) = (self.local.clone(), lba * self.block_size);
        let len = u64::from(blocks) * self.block_size;
        self.blocking(move || {
            let mut buf = vec![0u8; len as usize];
            dev.read_at(&mut buf, off)?;
            Ok(done(Bytes::from(buf)))
        });
    }

    pub(super) fn action(&mut self, a: Action) {
        match a {
            // Encoded into the session's output (large payloads by reference); written once
            // the pass is over.
            Action::Send { channel, message } => {
                if let Some(s) = &mut self.session {
                    s.queue(channel, &message);
                }
            }
            Action::DropPeerConnection => self.session = None,
            Action::Apply {
                token,
                lba,
                fua: false,
                data,
                ..
            } => self.applies.push((token, lba * self.block_size, data)),
            Action::Apply {
                token,
                lba,
                fua,
                data,
                ..
            } => {
                let (dev, off) = (self.local.clone(), lba * self.block_size);
                self.blocking(move || {
                    dev.write_at(&data, off)?;
                    if fua {
                        dev.flush()?;
                    }
                    Ok(Input::Applied(token))
                });
            }
            Action::ReadForResync {
                token,
                lba,
                blocks,
                sums,
            } => {
                let block_size = self.block_size as u32;
                self.read_local(lba, blocks, move |data| {
                    // Hashed here, on the I/O thread: the core's task answers heartbeats.
                    let data = if sums {
                        Bytes::from(replication::node::block_sums(&data, block_size))
                    } else {
                        data
                    };
                    Input::ResyncRead(token, data)
                });
            }
            Action::ReadForCaw { token, lba, blocks } => {
                self.read_local(lba, blocks, move |data| Input::CawRead(token, data));
            }
            Action::Fsync { token } => {
                let dev = self.local.clone();
                self.blocking(move || {
                    dev.flush()?;
                    Ok(Input::Fsynced(token))
                });
            }
            Action::Persist { token, op } => {
                if let Some(j) = &self.journal {
                    let _ = j.send((token, op));
                }
            }
            Action::AckWrite { id, result } => {
                if let Some(reply) = self.writes.remove(&id) {
                    reply.send(result);
                }
                self.submit_queued();
            }
            Action::CawDone { id, result } => {
                if let Some(reply) = self.caws.remove(&id) {
                    let _ = reply.try_send(result);
                }
                self.submit_queued();
            }
            Action::AckFlush { id, result } => {
                if let Some(reply) = self.flushes.remove(&id) {
                    reply.send(result);
                }
            }
            Action::AbortDone { .. } => {}
            Action::SharedInstalled { version, payload } => {
                self.shared_hub.installed(version, payload);
            }
            Action::SharedNotice { payload } => self.shared_hub.notice(&payload),
            Action::SharedDone { id, result } => {
                if let Some(reply) = self.shared.remove(&id) {
                    let _ = reply.try_send(result);
                }
            }
            Action::RaceForEpoch => {
                let (w, me) = (self.witness.clone(), self.me.clone());
                tokio::spawn(async move {
                    let _ = me.send(Input::Race(w.race().await));
                });
            }
            Action::MarkInSync { epoch } => {
                let (w, me) = (self.witness.clone(), self.me.clone());
                tokio::spawn(async move {
                    let ok = match w.mark_in_sync(epoch).await {
                        Ok(ok) => ok,
                        Err(e) => {
                            tracing::warn!(error = %e, "marking the pair in sync failed");
                            false
                        }
                    };
                    let _ = me.send(Input::InSync(ok));
                });
            }
            Action::SetAlua(a) => {
                tracing::info!(alua = ?a, "ALUA state");
                self.alua.send_replace(a);
            }
            Action::ResyncProgress { remaining } => self.resync_remaining = remaining,
            Action::Event(e) => match e {
                Event::Refused {
                    message,
                    reason,
                    drops_link: false,
                } => tracing::debug!(message, reason, "peer message refused"),
                Event::Refused {
                    message,
                    reason,
                    drops_link: true,
                } => tracing::warn!(
                    peer = %self.peer,
                    message,
                    reason,
                    "peer message refused: closing the peer link"
                ),
                Event::ResyncStalled { inflight } => tracing::warn!(
                    peer = %self.peer,
                    %inflight,
                    "resync moved nothing for the stall timeout: closing the peer link to start it again"
                ),
                Event::PeerSilent => tracing::warn!(
                    peer = %self.peer,
                    "nothing from the peer for the failure timeout: closing the peer link"
                ),
                Event::PeerLost => tracing::warn!(peer = %self.peer, "peer lost"),
                Event::State(s) => tracing::info!(state = s, "replica state"),
                Event::SplitBrain => tracing::error!(
                    peer = %self.peer,
                    "split brain: the handshake found no safe sync source; resolve by hand"
                ),
            },
        }
    }
}
