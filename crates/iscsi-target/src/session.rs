//! A logged-in session (one I_T nexus): CmdSN ordering across its connections, its task table,
//! and the handles to close its connections.

use crate::stats::ConnectionStats;
use crate::target::TargetRuntime;
use iscsi_proto::negotiation::SessionParams;
use iscsi_proto::pdu::Pdu;
use iscsi_proto::window::{Arrival, CommandOrderer};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

/// A request parked until the requests before it in CmdSN order have arrived (MC/S), then
/// handed back to the connection it came in on.
pub struct ReleasedCommand {
    pub pdu: Pdu,
}

/// One connection of a session, as the session sees it.
pub struct ConnectionHandle {
    pub cid: u16,
    pub portal: SocketAddr,
    pub peer: SocketAddr,
    pub stats: Arc<ConnectionStats>,
    /// Cancelled to make the connection close (logout from another connection, reinstatement).
    pub close: CancellationToken,
    /// Where commands released by the orderer are sent to be processed by their own connection.
    pub released: mpsc::UnboundedSender<ReleasedCommand>,
}

/// What the CmdSN check decided for one arriving request.
pub enum Delivery {
    /// Accepted: it and any requests it unblocked are in the caller's buffer or on their way
    /// to their own connections.
    Accepted,
    /// Outside the window or a duplicate: silently ignored (RFC 7143 3.2.2.1).
    Ignored,
}

/// State of a task for task management.
pub struct TaskEntry {
    pub lun: u64,
    /// The connection the task came in on (its allegiance).
    pub cid: u16,
    /// Set by ABORT TASK and friends: the response must not be sent.
    pub aborted: bool,
    /// Aborted by task management received on another I_T nexus (a LOGICAL UNIT RESET from
    /// another host): with TAS set in the control mode page (SPC-4 7.5.8) the task is answered
    /// TASK ABORTED instead of vanishing, so its host retries at once rather than waiting out
    /// its command timeout.
    pub tas: bool,
    /// Handed to the logical unit; until then an abort ends the task at once.
    pub executing: bool,
    /// Released by the CmdSN orderer: its end reopens the window by one.
    pub ordered: bool,
}

/// What becomes of a task whose turn has come ([`Session::begin_execution`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Begin {
    /// Hand it to the logical unit.
    Execute,
    /// Aborted from its own nexus: it is over, with no response.
    Over,
    /// Aborted from another nexus: answer TASK ABORTED ([`crate::exec::aborted`]).
    AnswerAborted,
}

/// A session (RFC 7143 3.3): shared by all its connections.
pub struct Session {
    pub tsih: u16,
    pub isid: [u8; 6],
    pub initiator_name: Arc<str>,
    pub params: SessionParams,
    /// `None` for a discovery session.
    pub target: Option<Arc<TargetRuntime>>,
    pub nexus: scsi::Nexus,
    pub tpgt: u16,
    order: Mutex<CommandOrderer<(u16, Pdu)>>,
    exp_cmd_sn: AtomicU32,
    max_cmd_sn: AtomicU32,
    pub connections: Mutex<Vec<ConnectionHandle>>,
    pub tasks: Mutex<HashMap<u32, TaskEntry>>,
    inflight: AtomicUsize,
    drained: Notify,
    /// Signalled when one of the session's connections has ended.
    pub connection_ended: Notify,
    /// Count of tasks waiting on `drained`, so completions notify only when someone listens.
    waiting: AtomicUsize,
    pub closing: CancellationToken,
}

impl Session {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tsih: u16,
        isid: [u8; 6],
        initiator_name: Arc<str>,
        params: SessionParams,
        target: Option<Arc<TargetRuntime>>,
        nexus: scsi::Nexus,
        tpgt: u16,
        first_cmd_sn: u32,
        // Requests the session may have queued or running (`limits.commands-per-session`):
        // MaxCmdSN opens only as they complete, so memory per session is bounded by this
        // (RFC 7143 3.2.2.1).
        window: u32,
    ) -> Self {
        let window = window.max(1);
        Session {
            tsih,
            isid,
            initiator_name,
            params,
            target,
            nexus,
            tpgt,
            order: Mutex::new(CommandOrderer::new(first_cmd_sn, window)),
            exp_cmd_sn: AtomicU32::new(first_cmd_sn),
            max_cmd_sn: AtomicU32::new(first_cmd_sn.wrapping_add(window - 1)),
            connections: Mutex::new(Vec::new()),
            tasks: Mutex::new(HashMap::new()),
            inflight: AtomicUsize::new(0),
            drained: Notify::new(),
            connection_ended: Notify::new(),
            waiting: AtomicUsize::new(0),
            closing: CancellationToken::new(),
        }
    }

    /// ExpCmdSN to report in responses.
    pub fn exp_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn.load(Ordering::Acquire)
    }

    /// MaxCmdSN to report; while the session closes it is ExpCmdSN - 1 so nothing new is
    /// accepted.
    pub fn max_cmd_sn(&self) -> u32 {
        if self.closing.is_cancelled() {
            self.exp_cmd_sn().wrapping_sub(1)
        } else {
            self.max_cmd_sn.load(Ordering::Acquire)
        }
    }

    fn publish(&self, order: &CommandOrderer<(u16, Pdu)>) {
        let w = order.window();
        self.exp_cmd_sn.store(w.exp_cmd_sn, Ordering::Release);
        self.max_cmd_sn.store(w.max_cmd_sn, Ordering::Release);
    }

    /// A request released in CmdSN order has ended: the window reopens by one.
    pub fn request_done(&self) {
        let mut order = self.order.lock();
        order.complete();
        self.publish(&order);
    }

    /// Orders a non-immediate request by CmdSN (RFC 7143 3.2.2.1). Requests released by its
    /// arrival are appended to `ready` when they came in on connection `cid`, and sent to
    /// their own connection otherwise (MC/S).
    pub fn deliver(&self, cid: u16, cmd_sn: u32, pdu: Pdu, ready: &mut Vec<Pdu>) -> Delivery {
        let mut order = self.order.lock();
        if let Arrival::Ignored(..) = order.push(cmd_sn, false, (cid, pdu)) {
            return Delivery::Ignored;
        }
        let mut elsewhere = Vec::new();
        while let Some((owner, p)) = order.pop_ready() {
            if owner == cid {
                ready.push(p);
            } else {
                elsewhere.push((owner, p));
            }
        }
        self.publish(&order);
        drop(order);
        if !elsewhere.is_empty() {
            let conns = self.connections.lock();
            for (owner, pdu) in elsewhere {
                match conns.iter().find(|c| c.cid == owner) {
                    Some(c) => {
                        let _ = c.released.send(ReleasedCommand { pdu });
                    }
                    // Its connection is gone: the request ends unprocessed (RFC 7143 6.2).
                    None => self.request_done(),
                }
            }
        }
        Delivery::Accepted
    }

    /// Registers a task; counted until `task_done`.
    pub fn task_started(&self, itt: u32, entry: TaskEntry) {
        self.inflight.fetch_add(1, Ordering::AcqRel);
        self.tasks.lock().insert(itt, entry);
    }

    pub fn task_done(&self, itt: u32) {
        self.finish_task(itt, |_| ());
    }

    /// Runs `send` (which queues a piece of the task's data-in) under the task-table lock if
    /// the task is still under way and not aborted: nothing of an aborted task goes out after
    /// its abort was decided. `false` when it did not run.
    pub fn while_live(&self, itt: u32, send: impl FnOnce()) -> bool {
        let tasks = self.tasks.lock();
        match tasks.get(&itt) {
            Some(t) if !t.aborted => {
                send();
                true
            }
            _ => false,
        }
    }

    /// Ends a task, running `respond` (which queues its response) under the task-table lock
    /// unless the task was aborted: a task is either answered or aborted, never both, so an
    /// ABORT TASK racing with completion gets "task does not exist" exactly when the response
    /// went out (RFC 7143 11.5.1). A task aborted from another I_T nexus is answered TASK
    /// ABORTED: `respond(true)`.
    pub fn finish_task(&self, itt: u32, respond: impl FnOnce(bool)) {
        {
            let mut tasks = self.tasks.lock();
            let ordered = match tasks.get(&itt) {
                Some(t) if !t.aborted || t.tas => {
                    respond(t.aborted);
                    t.ordered
                }
                Some(t) => t.ordered,
                None => return,
            };
            tasks.remove(&itt);
            if ordered {
                self.request_done();
            }
        }
        let last = self.inflight.fetch_sub(1, Ordering::AcqRel) == 1;
        if last || self.waiting.load(Ordering::Acquire) > 0 {
            self.drained.notify_waiters();
        }
    }

    /// Waits until connection `cid` has ended and none of its tasks is left (a logout of that
    /// connection from another one answers only then).
    pub async fn connection_gone(&self, cid: u16) {
        loop {
            let ended = self.connection_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if !self.connections.lock().iter().any(|c| c.cid == cid) {
                break;
            }
            ended.await;
        }
        self.wait_until(|tasks| !tasks.values().any(|t| t.cid == cid))
            .await;
    }

    /// Waits until no task of this session is executing.
    pub async fn drain(&self) {
        self.wait_until(|tasks| tasks.is_empty()).await;
    }

    /// Waits until `done` holds for the task table (checked after every task completion).
    pub async fn wait_until(&self, done: impl Fn(&HashMap<u32, TaskEntry>) -> bool) {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done(&self.tasks.lock()) {
                break;
            }
            notified.await;
        }
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }

    /// Marks the task ready to execute, unless it was aborted meanwhile.
    pub fn begin_execution(&self, itt: u32) -> Begin {
        let mut tasks = self.tasks.lock();
        match tasks.get_mut(&itt) {
            Some(t) if !t.aborted => {
                t.executing = true;
                Begin::Execute
            }
            Some(t) if t.tas => Begin::AnswerAborted,
            _ => Begin::Over,
        }
    }

    /// Aborts the tasks matching `pred`. Tasks not yet executing end at once; the tags of
    /// those executing are returned, to wait for with `wait_until`. `third_party`: the task
    /// management came from another I_T nexus, so each task is answered TASK ABORTED when it
    /// ends (a write still waiting for its data, once the data is in).
    pub fn abort_where(
        &self,
        third_party: bool,
        pred: impl Fn(u32, &TaskEntry) -> bool,
    ) -> Vec<u32> {
        let mut tasks = self.tasks.lock();
        let mut executing = Vec::new();
        let mut ended = 0;
        let mut reopen = 0;
        tasks.retain(|itt, t| {
            if !pred(*itt, t) {
                return true;
            }
            // Aborted from its own nexus too: no answer at all.
            t.tas = third_party && (t.tas || !t.aborted);
            t.aborted = true;
            if t.executing {
                executing.push(*itt);
                true
            } else if t.tas {
                // Answered when its connection gets to it (or ended with the connection).
                true
            } else {
                ended += 1;
                reopen += u32::from(t.ordered);
                false
            }
        });
        drop(tasks);
        for _ in 0..reopen {
            self.request_done();
        }
        if ended > 0 {
            let before = self.inflight.fetch_sub(ended, Ordering::AcqRel);
            if before == ended || self.waiting.load(Ordering::Acquire) > 0 {
                self.drained.notify_waiters();
            }
        }
        executing
    }

    /// Ends the session: every connection closes and no new command is admitted.
    pub fn close_all(&self) {
        self.closing.cancel();
        let _ = self.abort_where(false, |_, _| true);
        for c in self.connections.lock().iter() {
            c.close.cancel();
        }
    }

    /// Tasks registered and not yet ended, immediate ones included.
    pub fn tasks_in_flight(&self) -> usize {
        self.inflight.load(Ordering::Acquire)
    }

    pub fn connection_count(&self) -> usize {
        self.connections.lock().len()
    }
}
