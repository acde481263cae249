//! A logged-in session (one I_T nexus): CmdSN ordering across its connections, its task table,
//! and the handles to close its connections.

use crate::stats::ConnectionStats;
use crate::target::TargetRuntime;
use iscsi_proto::negotiation::SessionParams;
use iscsi_proto::pdu::Pdu;
use iscsi_proto::serial;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

/// Commands a session may have outstanding: the CmdSN window is this wide (RFC 7143 3.2.2.1).
pub const COMMAND_WINDOW: u32 = 128;

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

/// What the CmdSN check decided for one arriving command.
pub enum Delivery {
    /// In order: process now. Any later commands it unblocked have been sent to their owners.
    Now,
    /// Parked until the gap before it is filled.
    Parked,
    /// Outside the window: silently ignored (RFC 7143 3.2.2.1).
    Ignored,
}

struct Ordering_ {
    exp_cmd_sn: u32,
    /// Commands that arrived ahead of `exp_cmd_sn`, with the CID they arrived on.
    parked: BTreeMap<u32, (u16, Pdu)>,
}

/// State of a task for task management.
pub struct TaskEntry {
    pub lun: u64,
    /// Set by ABORT TASK and friends: the response must not be sent.
    pub aborted: bool,
    /// Handed to the logical unit; until then an abort ends the task at once.
    pub executing: bool,
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
    order: Mutex<Ordering_>,
    exp_cmd_sn: AtomicU32,
    pub connections: Mutex<Vec<ConnectionHandle>>,
    pub tasks: Mutex<HashMap<u32, TaskEntry>>,
    inflight: AtomicUsize,
    drained: Notify,
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
    ) -> Self {
        Session {
            tsih,
            isid,
            initiator_name,
            params,
            target,
            nexus,
            tpgt,
            order: Mutex::new(Ordering_ {
                exp_cmd_sn: first_cmd_sn,
                parked: BTreeMap::new(),
            }),
            exp_cmd_sn: AtomicU32::new(first_cmd_sn),
            connections: Mutex::new(Vec::new()),
            tasks: Mutex::new(HashMap::new()),
            inflight: AtomicUsize::new(0),
            drained: Notify::new(),
            waiting: AtomicUsize::new(0),
            closing: CancellationToken::new(),
        }
    }

    /// ExpCmdSN to report in responses.
    pub fn exp_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn.load(Ordering::Acquire)
    }

    /// MaxCmdSN to report: the window stays `COMMAND_WINDOW` wide; while the session closes it
    /// shrinks to ExpCmdSN - 1 so no new command is accepted.
    pub fn max_cmd_sn(&self) -> u32 {
        let exp = self.exp_cmd_sn();
        if self.closing.is_cancelled() {
            exp.wrapping_sub(1)
        } else {
            exp.wrapping_add(COMMAND_WINDOW - 1)
        }
    }

    /// Orders a non-immediate request by CmdSN (RFC 7143 3.2.2.1). Requests arriving early
    /// are parked; when `pdu` fills a gap, the requests it unblocks are released to the
    /// connections they came in on.
    pub fn deliver(&self, cid: u16, cmd_sn: u32, pdu: Pdu) -> (Delivery, Option<Pdu>) {
        let mut order = self.order.lock();
        let exp = order.exp_cmd_sn;
        let max = exp.wrapping_add(COMMAND_WINDOW - 1);
        if serial::lt(cmd_sn, exp) || serial::gt(cmd_sn, max) {
            return (Delivery::Ignored, None);
        }
        if cmd_sn != exp {
            if order.parked.contains_key(&cmd_sn) {
                return (Delivery::Ignored, None);
            }
            order.parked.insert(cmd_sn, (cid, pdu));
            return (Delivery::Parked, None);
        }
        let mut next = exp.wrapping_add(1);
        let mut released = Vec::new();
        while let Some(entry) = order.parked.remove(&next) {
            released.push(entry);
            next = next.wrapping_add(1);
        }
        order.exp_cmd_sn = next;
        self.exp_cmd_sn.store(next, Ordering::Release);
        drop(order);
        if !released.is_empty() {
            let conns = self.connections.lock();
            for (owner, pdu) in released {
                if let Some(c) = conns.iter().find(|c| c.cid == owner) {
                    let _ = c.released.send(ReleasedCommand { pdu });
                }
            }
        }
        (Delivery::Now, Some(pdu))
    }

    /// Registers a task; counted until `task_done`.
    pub fn task_started(&self, itt: u32, entry: TaskEntry) {
        self.inflight.fetch_add(1, Ordering::AcqRel);
        self.tasks.lock().insert(itt, entry);
    }

    pub fn task_done(&self, itt: u32) {
        self.finish_task(itt, || ());
    }

    /// Ends a task, running `respond` (which queues its response) under the task-table lock
    /// unless the task was aborted: a task is either answered or aborted, never both, so an
    /// ABORT TASK racing with completion gets "task does not exist" exactly when the response
    /// went out (RFC 7143 11.5.1).
    pub fn finish_task(&self, itt: u32, respond: impl FnOnce()) {
        {
            let mut tasks = self.tasks.lock();
            match tasks.get(&itt) {
                Some(t) if !t.aborted => respond(),
                Some(_) => {}
                None => return,
            }
            tasks.remove(&itt);
        }
        let last = self.inflight.fetch_sub(1, Ordering::AcqRel) == 1;
        if last || self.waiting.load(Ordering::Acquire) > 0 {
            self.drained.notify_waiters();
        }
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

    /// Marks the task ready to execute; false if it was aborted meanwhile (then it is over).
    pub fn begin_execution(&self, itt: u32) -> bool {
        let mut tasks = self.tasks.lock();
        match tasks.get_mut(&itt) {
            Some(t) if !t.aborted => {
                t.executing = true;
                true
            }
            _ => false,
        }
    }

    /// Aborts the tasks matching `pred`. Tasks not yet executing end at once; the tags of
    /// those executing are returned, to wait for with `wait_until`.
    pub fn abort_where(&self, pred: impl Fn(u32, &TaskEntry) -> bool) -> Vec<u32> {
        let mut tasks = self.tasks.lock();
        let mut executing = Vec::new();
        let mut ended = 0;
        tasks.retain(|itt, t| {
            if !pred(*itt, t) {
                return true;
            }
            t.aborted = true;
            if t.executing {
                executing.push(*itt);
                true
            } else {
                ended += 1;
                false
            }
        });
        drop(tasks);
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
        let _ = self.abort_where(|_, _| true);
        for c in self.connections.lock().iter() {
            c.close.cancel();
        }
    }

    pub fn connection_count(&self) -> usize {
        self.connections.lock().len()
    }
}
