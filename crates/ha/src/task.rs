//! The one task that owns a LUN's `Replica`: every input (host requests, local I/O
//! completions, journal progress, peer frames, etcd answers, timers) arrives here, is fed to
//! the core, and the core's actions are carried out before the next input.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockstore::BlockDevice;
use bytes::Bytes;
use lanes_witness::Witness;
use replication::{
    Action, Alua, CawOutcome, Event, HostError, MetaOp, Nanos, RaceOutcome, Replica, SharedOutcome,
    Token,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

mod actions;

use crate::link::{self, Session, Streams};
use crate::local_io::LocalIo;
use crate::PairStatus;

pub(crate) use crate::reply::{ReadReply, Reply};
pub(crate) type SharedReply = SyncSender<Result<SharedOutcome, HostError>>;
pub(crate) type CawReply = SyncSender<Result<CawOutcome, HostError>>;

/// A host request beyond the core's in-flight limit, submitted as earlier ones complete.
pub(crate) enum Queued {
    Write(u64, u64, u32, bool, Bytes),
    Caw {
        id: u64,
        lba: u64,
        blocks: u32,
        verify: Bytes,
        write: Bytes,
    },
}

/// Longest a read waits for the replica to be allowed to serve it.
const READ_HOLD: Nanos = 30_000_000_000;

/// States in which a read not allowed now may become allowed without a resync: paired or
/// sync source (the next heartbeat acknowledgement renews the lease), or suspended while
/// serving (the race decides).
fn may_serve_soon(state: &replication::State) -> bool {
    use replication::State;
    matches!(
        state,
        State::Paired { .. } | State::ResyncSource { .. } | State::Suspended { serving: true, .. }
    )
}

/// Inputs from outside the core task (host side and local completions).
pub(crate) enum Input {
    Write {
        lba: u64,
        blocks: u32,
        fua: bool,
        data: Bytes,
        reply: Reply,
    },
    Flush {
        reply: Reply,
    },
    /// COMPARE AND WRITE (executed by the pair's leader; see `replication::node`).
    Caw {
        lba: u64,
        blocks: u32,
        verify: Bytes,
        write: Bytes,
        reply: CawReply,
    },
    ReadCheck {
        reply: ReadReply,
    },
    /// Change the shared SCSI state (see [`crate::ReplicatedLun::change_shared`]).
    Shared {
        base: u64,
        payload: Bytes,
        reply: SharedReply,
    },
    /// Unit attentions for the peer's nexuses.
    Notice {
        payload: Bytes,
        reply: SharedReply,
    },
    Applied(Token),
    ResyncRead(Token, Bytes),
    CawRead(Token, Bytes),
    Fsynced(Token),
    LocalFailed(String),
    Persisted(Token),
    JournalFailed(String),
    Race(RaceOutcome),
    InSync(bool),
    Shutdown,
}

pub(crate) struct Driver {
    pub replica: Replica,
    pub start: Instant,
    pub node: u8,
    pub peer: SocketAddr,
    pub local: Arc<dyn BlockDevice>,
    pub block_size: u64,
    pub inputs: mpsc::UnboundedReceiver<Input>,
    pub me: mpsc::UnboundedSender<Input>,
    /// New connections from the dialer or the acceptor.
    pub link_rx: mpsc::UnboundedReceiver<Streams>,
    pub link_tx: mpsc::UnboundedSender<Streams>,
    /// Frames decoded from the peer in one read, reused.
    pub frames: Vec<replication::Message>,
    pub journal: Option<std::sync::mpsc::Sender<(Token, MetaOp)>>,
    pub journal_thread: Option<std::thread::JoinHandle<()>>,
    /// Threads for local I/O (applies, resync reads, fsyncs); `None` once stopped.
    pub io: Option<LocalIo>,
    pub witness: Arc<Witness>,
    pub alua: watch::Sender<Alua>,
    pub status: watch::Sender<PairStatus>,
    pub session: Option<Session>,
    pub next_session: u64,
    pub dialer: Option<JoinHandle<()>>,
    pub acceptor: Option<JoinHandle<()>>,
    pub writes: HashMap<u64, Reply>,
    pub next_write: u64,
    /// Host writes and CAWs beyond the core's in-flight limit, submitted as earlier ones
    /// complete.
    pub queued: VecDeque<Queued>,
    /// COMPARE AND WRITEs in flight, by id (the same id space as writes).
    pub caws: HashMap<u64, CawReply>,
    pub flushes: HashMap<u64, Reply>,
    pub next_flush: u64,
    pub local_io: usize,
    pub resync_remaining: u64,
    /// When the dirty-region count (a bitmap scan) was last taken, and its value.
    pub dirty_at: Option<Instant>,
    pub dirty: u64,
    /// Reads waiting for the read lease, until a deadline.
    pub read_waiters: Vec<(Nanos, ReadReply)>,
    /// Shared-state changes and notices in flight, by id.
    pub shared: HashMap<u64, SharedReply>,
    pub next_shared: u64,
    /// This node's copy of the shared state and who is told of its changes.
    pub shared_hub: Arc<crate::shared::SharedHub>,
    /// Plain (not FUA) applies of the current pass over the core's actions, handed to one
    /// local I/O thread together when the pass ends (`Driver::apply_batch`).
    pub applies: Vec<(Token, u64, Bytes)>,
    /// Until then, plain applies go to the I/O threads even when small (the file system was
    /// slow to take some on this task).
    pub inline_off_until: Option<Instant>,
    /// See [`crate::PairConfig::inline_slow`].
    pub inline_slow: Duration,
}

/// Most inputs (or peer frames) fed to the core before its actions are carried out: under
/// load one pass then answers many of them, with one wake-up of a local I/O thread and one
/// of the peer link's writer instead of one each.
const BATCH: usize = 64;

impl Driver {
    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    pub async fn run(mut self) {
        let mut stop = None;
        self.settle();
        self.ensure_link();
        self.publish();
        // Status (the dirty count) is refreshed at least this often.
        let mut refresh = tokio::time::interval(Duration::from_millis(250));
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let now = self.now();
            let deadline = self
                .replica
                .next_timer()
                .map(|t| t.max(now + 1_000_000))
                .map(|t| tokio::time::Instant::from_std(self.start + Duration::from_nanos(t)));
            let backlog = [0, 1].map(|i| self.session.as_ref().is_some_and(|s| s.backlog(i)));
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                input = self.inputs.recv() => match self.inputs_from(input) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(reason) => {
                        stop = Some(reason);
                        break;
                    }
                },
                Some(streams) = self.link_rx.recv() => self.connected(streams),
                r = link::readable(&self.session, 0) => self.peer_readable(0, r),
                r = link::readable(&self.session, 1) => self.peer_readable(1, r),
                r = link::writable(&self.session, 0), if backlog[0] => self.peer_writable(0, r),
                r = link::writable(&self.session, 1), if backlog[1] => self.peer_writable(1, r),
                _ = refresh.tick() => {}
                () = sleep => {
                    let now = self.now();
                    self.replica.tick(now);
                }
            }
            self.settle();
            self.ensure_link();
            self.reads();
            self.publish();
        }
        self.stop(stop).await;
    }

    /// Stop like a crash: the peer link goes, waiters get errors, local I/O under way ends.
    async fn stop(mut self, reason: Option<String>) {
        if let Some(r) = &reason {
            tracing::error!(reason = %r, "replicated LUN stopped");
        }
        self.session = None;
        for h in [self.dialer.take(), self.acceptor.take()]
            .into_iter()
            .flatten()
        {
            h.abort();
        }
        self.writes.clear();
        self.caws.clear();
        self.flushes.clear();
        self.shared.clear();
        self.queued.clear();
        self.status.send_modify(|s| {
            s.state = if reason.is_some() {
                "Failed"
            } else {
                "Stopped"
            };
            s.peer_connected = false;
        });
        while self.local_io > 0 {
            match self.inputs.recv().await {
                Some(
                    Input::Applied(_)
                    | Input::ResyncRead(..)
                    | Input::CawRead(..)
                    | Input::Fsynced(_),
                )
                | Some(Input::LocalFailed(_)) => self.local_io -= 1,
                Some(_) => {}
                None => break,
            }
        }
        self.journal = None;
        let (journal, io) = (self.journal_thread.take(), self.io.take());
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(io) = io {
                io.join();
            }
            if let Some(t) = journal {
                let _ = t.join();
            }
        })
        .await;
    }

    /// `first` and the inputs already queued behind it (at most [`BATCH`]), fed to the core
    /// before its actions run once for all of them. `Ok(false)`: shut down.
    fn inputs_from(&mut self, first: Option<Input>) -> Result<bool, String> {
        let mut input = first;
        for taken in 1..=BATCH {
            match input {
                Some(Input::Shutdown) | None => return Ok(false),
                Some(i) => self.input(i)?,
            }
            if taken == BATCH {
                break;
            }
            input = match self.inputs.try_recv() {
                Ok(i) => Some(i),
                // Empty, or every sender gone (the next `recv` says so).
                Err(_) => break,
            };
        }
        Ok(true)
    }

    fn input(&mut self, i: Input) -> Result<(), String> {
        let now = self.now();
        let r = &mut self.replica;
        match i {
            Input::Write {
                lba,
                blocks,
                fua,
                data,
                reply,
            } => {
                let id = self.next_write;
                self.next_write += 1;
                self.writes.insert(id, reply);
                if self.writes.len() + self.caws.len() > r.config().max_inflight {
                    self.queued
                        .push_back(Queued::Write(id, lba, blocks, fua, data));
                } else {
                    r.submit_write(now, id, lba, blocks, fua, data);
                }
            }
            Input::Caw {
                lba,
                blocks,
                verify,
                write,
                reply,
            } => {
                let id = self.next_write;
                self.next_write += 1;
                self.caws.insert(id, reply);
                if self.writes.len() + self.caws.len() > r.config().max_inflight {
                    self.queued.push_back(Queued::Caw {
                        id,
                        lba,
                        blocks,
                        verify,
                        write,
                    });
                } else {
                    // Durability (FUA, write cache off) is the SCSI layer's flush after it.
                    r.submit_caw(now, id, lba, blocks, false, verify, write);
                }
            }
            Input::Flush { reply } => {
                let id = self.next_flush;
                self.next_flush += 1;
                self.flushes.insert(id, reply);
                r.submit_flush(now, id);
            }
            Input::ReadCheck { reply } => {
                if r.read_allowed(now) {
                    reply.send(true);
                } else if may_serve_soon(r.state()) {
                    // Paired without a running lease yet (a heartbeat late), or suspended
                    // after losing the peer: held, as writes are, until the lease or the race
                    // decides (bounded, so a stuck pair cannot hold a thread forever).
                    self.read_waiters.push((now + READ_HOLD, reply));
                } else {
                    reply.send(false);
                }
            }
            Input::Shared {
                base,
                payload,
                reply,
            } => {
                let id = self.next_shared;
                self.next_shared += 1;
                self.shared.insert(id, reply);
                r.submit_shared(now, id, base, payload);
            }
            Input::Notice { payload, reply } => {
                let id = self.next_shared;
                self.next_shared += 1;
                self.shared.insert(id, reply);
                r.submit_notice(now, id, payload);
            }
            Input::Applied(t) => {
                self.local_io -= 1;
                r.apply_done(now, t);
            }
            Input::ResyncRead(t, data) => {
                self.local_io -= 1;
                r.resync_read_done(now, t, data);
            }
            Input::CawRead(t, data) => {
                self.local_io -= 1;
                r.caw_read_done(now, t, data);
            }
            Input::Fsynced(t) => {
                self.local_io -= 1;
                r.fsync_done(now, t);
            }
            Input::LocalFailed(e) => {
                self.local_io -= 1;
                return Err(format!("local I/O failed: {e}"));
            }
            Input::Persisted(t) => r.meta_persisted(now, t),
            Input::JournalFailed(e) => return Err(format!("metadata journal failed: {e}")),
            Input::Race(outcome) => {
                tracing::info!(?outcome, "epoch race");
                r.race_result(now, outcome);
            }
            Input::InSync(ok) => r.in_sync_result(now, ok),
            Input::Shutdown => {}
        }
        Ok(())
    }

    /// A new pair of connections to the peer: it replaces the session there was.
    fn connected(&mut self, streams: Streams) {
        let now = self.now();
        self.dialer = None;
        if self.session.take().is_some() {
            self.replica.peer_disconnected(now);
        }
        self.next_session += 1;
        self.session = Some(Session::new(streams));
        tracing::info!(peer = %self.peer, "peer link up");
        self.replica.peer_connected(now);
    }

    /// Connection `i` of the session has bytes: feed its frames to the core.
    fn peer_readable(&mut self, i: usize, ready: std::io::Result<()>) {
        let Some(s) = &mut self.session else { return };
        let mut frames = std::mem::take(&mut self.frames);
        let read = ready
            .map_err(|e| format!("read: {e}"))
            .and_then(|()| s.read(i, &mut frames));
        let now = self.now();
        for message in frames.drain(..) {
            self.replica.receive(now, message);
        }
        self.frames = frames;
        if let Err(reason) = read {
            self.broken(reason);
        }
    }

    /// Connection `i` takes bytes again: write its backlog.
    fn peer_writable(&mut self, i: usize, ready: std::io::Result<()>) {
        let Some(s) = &mut self.session else { return };
        if let Err(reason) = ready
            .map_err(|e| format!("write: {e}"))
            .and_then(|()| s.flush_one(i))
        {
            self.broken(reason);
        }
    }

    /// Write what this pass queued for the peer, as far as the sockets take it now.
    fn flush_link(&mut self) {
        let Some(s) = &mut self.session else { return };
        if let Err(reason) = s.flush() {
            self.broken(reason);
        }
    }

    fn broken(&mut self, reason: String) {
        tracing::warn!(peer = %self.peer, %reason, "peer link down");
        self.session = None;
        let now = self.now();
        self.replica.peer_disconnected(now);
    }

    /// Node 0 dials whenever it has no session (node 1 accepts in the background).
    fn ensure_link(&mut self) {
        if self.node != 0 || self.session.is_some() {
            return;
        }
        if self.dialer.as_ref().is_some_and(|d| !d.is_finished()) {
            return;
        }
        let (peer, tx) = (self.peer, self.link_tx.clone());
        let nonce = self.next_session.wrapping_add(1) ^ (self.start.elapsed().as_nanos() as u64);
        self.dialer = Some(tokio::spawn(async move {
            let _ = tx.send(link::dial(peer, 0, nonce).await);
        }));
    }

    /// Carry out the core's actions until it has none: the frames go out before this pass's
    /// applies are written (so the peer starts on a write while this node writes it too), and
    /// applies completed on this task give the core more to do.
    fn settle(&mut self) {
        loop {
            while let Some(a) = self.replica.poll_action() {
                self.action(a);
            }
            self.flush_link();
            if !self.apply_batch() {
                break;
            }
        }
    }

    /// A host request completed: submit the next one queued, if any.
    fn submit_queued(&mut self) {
        let now = self.now();
        match self.queued.pop_front() {
            Some(Queued::Write(id, lba, blocks, fua, data)) => {
                self.replica.submit_write(now, id, lba, blocks, fua, data);
            }
            Some(Queued::Caw {
                id,
                lba,
                blocks,
                verify,
                write,
            }) => {
                self.replica
                    .submit_caw(now, id, lba, blocks, false, verify, write);
            }
            None => {}
        }
    }

    /// Run local I/O on the LUN's own threads (`local_io`), never on tokio's blocking pool: the
    /// callers waiting for this LUN may hold every thread of that pool.
    fn blocking(&mut self, f: impl FnOnce() -> std::io::Result<Input> + Send + 'static) {
        let Some(io) = &self.io else {
            return;
        };
        self.local_io += 1;
        let me = self.me.clone();
        io.run(Box::new(move || {
            let input = match catch_unwind(AssertUnwindSafe(f)) {
                Ok(Ok(input)) => input,
                Ok(Err(e)) => Input::LocalFailed(e.to_string()),
                Err(_) => Input::LocalFailed("local I/O panicked".into()),
            };
            let _ = me.send(input);
        }));
    }

    /// Answer reads waiting for the lease: allowed now, or refused at their deadline.
    fn reads(&mut self) {
        if self.read_waiters.is_empty() {
            return;
        }
        let now = self.now();
        let allowed = self.replica.read_allowed(now);
        let hopeless = !may_serve_soon(self.replica.state());
        let waiting = std::mem::take(&mut self.read_waiters);
        for (until, reply) in waiting {
            if allowed || hopeless || now >= until {
                reply.send(allowed);
            } else {
                self.read_waiters.push((until, reply));
            }
        }
    }

    fn publish(&mut self) {
        let r = &self.replica;
        let state = r.state().name();
        if state == "Paired" {
            self.resync_remaining = 0;
        }
        let stale = self
            .dirty_at
            .is_none_or(|t| t.elapsed() > Duration::from_millis(200));
        if stale || state != self.status.borrow().state {
            self.dirty = r.dirty_regions();
            self.dirty_at = Some(Instant::now());
        }
        let next = PairStatus {
            state,
            epoch: r.epoch(),
            peer_connected: self.session.is_some(),
            resync_remaining: self.resync_remaining,
            dirty_regions: self.dirty,
            alua: *self.alua.borrow(),
            stats: r.stats(),
        };
        self.status.send_if_modified(|s| {
            if *s == next {
                false
            } else {
                *s = next;
                true
            }
        });
    }
}
