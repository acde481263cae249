//! Leases and oplocks held on a file (MS-SMB2 3.3.1.4, 3.3.4.6, 3.3.4.7, 3.3.5.22): who
//! caches what (`Holder`), the breaks a contending CREATE starts and waits for, the break
//! notifications, acknowledgments and the 35-second break timeout. The rules themselves are in
//! `lease`. A notification goes to the connection the holder last opened the file on, or, when
//! that connection is gone, to another channel of its session.

use std::sync::Arc;
use std::time::Duration;

use smb_proto::msg::oplock::LEASE_BREAK_ACK_REQUIRED;
use smb_proto::msg::{encode_message, FileId, Message as _, OplockBreak};
use smb_proto::{Command, Header, HeaderIds, NtStatus};
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

use super::lease::{self, Contender};
use super::open::Open;
use crate::conn::Reply;
use crate::state::{FileKey, FileState, LeaseIndex, Server, ShareEntry};

/// How long a break waits for its acknowledgment (MS-SMB2 3.3.2.1: 35 s).
pub const BREAK_TIMEOUT: Duration = Duration::from_secs(35);
const INVALID_OPLOCK_PROTOCOL: NtStatus = NtStatus(0xC000_00E3);
const UNSUCCESSFUL: NtStatus = NtStatus(0xC000_0001);
const REQUEST_NOT_ACCEPTED: NtStatus = NtStatus(0xC000_00D0);

/// Whose caching a holder is: a lease (all opens of one client under one key share it) or
/// the oplock of one open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Lease {
        client_guid: [u8; 16],
        key: [u8; 16],
        v2: bool,
        parent: Option<[u8; 16]>,
    },
    Oplock {
        open: u64,
    },
}

/// Caching held on a file.
#[derive(Debug)]
pub struct Holder {
    pub owner: Owner,
    /// The opens under it (one for an oplock).
    pub opens: Vec<u64>,
    pub state: u32,
    /// Lease epoch (version 2 leases; MS-SMB2 3.3.1.4 Lease.Epoch).
    pub epoch: u16,
    /// While a break waits for its acknowledgment: the state it breaks to and when it times
    /// out.
    pub breaking: Option<(u32, Instant)>,
    pub session_id: u64,
    /// The writer of the connection the holder last opened the file on.
    pub tx: UnboundedSender<Vec<u8>>,
}

/// The open that contends with the holders of a file, before its CREATE proceeds.
#[derive(Debug, Clone, Copy)]
pub struct Requester {
    pub client_guid: [u8; 16],
    /// Its lease key: its own lease is not broken.
    pub lease_key: Option<[u8; 16]>,
    pub access: u32,
    pub share_access: u32,
    pub overwrite: bool,
    /// It asks for FILE_DELETE_ON_CLOSE.
    pub delete_on_close: bool,
}

/// What a contending CREATE does next.
pub enum Step {
    Proceed,
    /// Breaks are waiting for acknowledgments: wait for a change of the file's state, or
    /// until `deadline`.
    Wait {
        changed: Arc<tokio::sync::Notify>,
        deadline: Instant,
    },
}

/// A notification to deliver once the file table's lock is released.
pub(super) struct Send {
    session_id: u64,
    tx: UnboundedSender<Vec<u8>>,
    frame: Vec<u8>,
}

impl Holder {
    pub(crate) fn owned_by(&self, r: &Requester) -> bool {
        matches!(self.owner, Owner::Lease { client_guid, key, .. }
            if r.lease_key == Some(key) && r.client_guid == client_guid)
    }

    /// Whether an open with `access` is a stat open for this holder: one that breaks
    /// nothing.
    pub(crate) fn stat_open(&self, access: u32) -> bool {
        match self.owner {
            Owner::Lease { .. } => super::open::lease_stat_open(access),
            Owner::Oplock { .. } => super::open::oplock_stat_open(access),
        }
    }

    pub(crate) fn is_lease(&self, guid: &[u8; 16], lease_key: &[u8; 16]) -> bool {
        matches!(&self.owner, Owner::Lease { client_guid, key, .. }
            if client_guid == guid && key == lease_key)
    }

    /// Starts a break to `target`: with an acknowledgment to wait for, or at once.
    pub(super) fn begin_break(&mut self, target: u32, ack: bool, now: Instant) -> Send {
        let body = match self.owner {
            Owner::Lease { key, v2, .. } => {
                if v2 {
                    self.epoch = self.epoch.wrapping_add(1);
                }
                OplockBreak::LeaseNotification {
                    new_epoch: if v2 { self.epoch } else { 0 },
                    flags: if ack { LEASE_BREAK_ACK_REQUIRED } else { 0 },
                    lease_key: key,
                    current_lease_state: self.state,
                    new_lease_state: target,
                }
            }
            Owner::Oplock { open } => OplockBreak::Oplock {
                oplock_level: lease::oplock_level(target),
                file_id: FileId {
                    persistent: open,
                    volatile: open,
                },
            },
        };
        if ack {
            self.breaking = Some((target, now + BREAK_TIMEOUT));
        } else {
            self.state = target;
        }
        tracing::debug!(
            "SMB break {:?}: {} -> {}",
            self.owner,
            lease::describe(self.state),
            lease::describe(target)
        );
        Send {
            session_id: self.session_id,
            tx: self.tx.clone(),
            frame: notification(&body),
        }
    }
}

/// An unsolicited OPLOCK_BREAK notification: MessageId all ones, no session (MS-SMB2 3.3.4.6,
/// 3.3.4.7).
fn notification(body: &OplockBreak) -> Vec<u8> {
    let mut blank = [0u8; 64];
    blank[..4].copy_from_slice(&smb_proto::header::PROTOCOL_ID);
    blank[4] = 64;
    let mut out = vec![0u8; 4];
    if let Ok(mut h) = Header::decode(&blank) {
        h.command = Command::OplockBreak;
        h.flags.0 = smb_proto::header::Flags::SERVER_TO_REDIR;
        h.message_id = u64::MAX;
        h.ids = HeaderIds::Sync {
            process_id: 0,
            tree_id: 0,
        };
        out.extend_from_slice(&encode_message(&h, body));
    }
    crate::conn::set_prefix(&mut out);
    out
}

/// Sends a notification on the holder's connection, or on another channel of its session when
/// that connection is gone (MS-SMB2 3.3.4.6: any channel of the session will do).
pub(super) fn deliver(server: &Server, s: Send) -> bool {
    if s.tx.send(s.frame.clone()).is_ok() {
        return true;
    }
    let Some(session) = server.session(s.session_id) else {
        return false;
    };
    let channels: Vec<_> = {
        let mut st = session.state.lock();
        st.channel_tx.retain(|tx| !tx.is_closed());
        st.channel_tx.clone()
    };
    channels.iter().any(|tx| tx.send(s.frame.clone()).is_ok())
}

/// Breaks, for the open `req` is about to make, the caching of `key` that other lease keys and
/// oplocks hold; says whether acknowledgments are outstanding. Idempotent: a break under way
/// is not sent again.
pub fn start_breaks(server: &Server, key: FileKey, req: &Requester) -> Step {
    let now = Instant::now();
    let mut sends = Vec::new();
    let step = {
        let mut files = server.files.lock();
        let Some(st) = files.get_mut(&key) else {
            return Step::Proceed;
        };
        // The CREATE will fail with DELETE_PENDING: it breaks nothing (smb2.oplock.doc).
        if st.delete_pending {
            return Step::Proceed;
        }
        let FileState {
            entries, holders, ..
        } = st;
        let mut deadline: Option<Instant> = None;
        for h in holders.iter_mut() {
            if h.owned_by(req) {
                continue;
            }
            if let Some((_, d)) = h.breaking {
                deadline = Some(deadline.map_or(d, |x| x.min(d)));
                continue;
            }
            let c = Contender {
                stat_open: h.stat_open(req.access),
                sharing_violation: violates(entries, &h.opens, req),
                overwrite: req.overwrite,
                delete: req.delete_on_close,
            };
            let (target, ack) = match h.owner {
                Owner::Lease { .. } => (
                    lease::break_to(h.state, c),
                    lease::lease_break_needs_ack(h.state),
                ),
                Owner::Oplock { .. } => (
                    lease::oplock_break_to(h.state, c),
                    lease::oplock_break_needs_ack(h.state),
                ),
            };
            if target == h.state {
                continue;
            }
            sends.push(h.begin_break(target, ack, now));
            if ack {
                let d = now + BREAK_TIMEOUT;
                deadline = Some(deadline.map_or(d, |x| x.min(d)));
            }
        }
        holders.retain(|h| !(matches!(h.owner, Owner::Oplock { .. }) && h.state == 0));
        match deadline {
            Some(deadline) => Step::Wait {
                changed: st.changed.clone(),
                deadline,
            },
            None => Step::Proceed,
        }
    };
    for s in sends {
        if !deliver(server, s) {
            tracing::debug!("SMB break notification: no channel of the holder's session left");
        }
    }
    step
}

pub use super::breaks::{
    break_handles, break_on_lock, break_readers, renames_or_deletes, start_handle_breaks,
};

fn violates(entries: &[ShareEntry], opens: &[u64], req: &Requester) -> bool {
    entries
        .iter()
        .filter(|e| opens.contains(&e.open))
        .any(|e| super::open::conflicts(req.access, req.share_access, e))
}

/// Breaks that were not acknowledged by their deadline count as acknowledged to their target
/// (MS-SMB2 3.3.2.1, the oplock and lease break acknowledgment timers).
pub fn expire_breaks(server: &Server, key: FileKey, now: Instant) {
    let mut files = server.files.lock();
    let Some(st) = files.get_mut(&key) else {
        return;
    };
    let mut any = false;
    for h in st.holders.iter_mut() {
        if let Some((target, d)) = h.breaking {
            if d <= now {
                tracing::warn!(
                    "SMB break of {:?} not acknowledged within {BREAK_TIMEOUT:?}",
                    h.owner
                );
                h.state = target;
                h.breaking = None;
                any = true;
            }
        }
    }
    st.holders
        .retain(|h| !(matches!(h.owner, Owner::Oplock { .. }) && h.state == 0));
    if any {
        st.changed.notify_waiters();
    }
}

/// Starts the breaks `req` needs and waits until they are acknowledged, time out, or the
/// holders' opens close; returns early once `cancelled` is set.
pub async fn wait_for_breaks(
    server: &Server,
    key: FileKey,
    req: &Requester,
    cancelled: Option<&std::sync::atomic::AtomicBool>,
) {
    wait_until_acknowledged(server, key, cancelled, || start_breaks(server, key, req)).await;
}

/// Runs `step` (which starts breaks and says whether acknowledgments are outstanding) until
/// it says Proceed, waiting for changes of the file's holders or the break timeout between;
/// returns early once `cancelled` is set.
pub async fn wait_until_acknowledged(
    server: &Server,
    key: FileKey,
    cancelled: Option<&std::sync::atomic::AtomicBool>,
    step: impl Fn() -> Step,
) {
    loop {
        let Step::Wait { changed, .. } = step() else {
            return;
        };
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Re-checked after registering, so a change in between is not missed.
        let Step::Wait { deadline, .. } = step() else {
            return;
        };
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            expire_breaks(server, key, Instant::now());
        }
        if cancelled.is_some_and(|c| c.load(std::sync::atomic::Ordering::Acquire)) {
            return;
        }
    }
}

/// Whether waiting for `req`'s breaks would wait for a holder on the connection `tx` writes
/// to (which cannot read the acknowledgment while it waits inline).
pub fn waits_on(
    server: &Server,
    key: FileKey,
    req: &Requester,
    tx: &UnboundedSender<Vec<u8>>,
) -> bool {
    server.files.lock().get(&key).is_some_and(|st| {
        st.holders
            .iter()
            .any(|h| !h.owned_by(req) && h.breaking.is_some() && h.tx.same_channel(tx))
    })
}

/// An open of the file goes: it leaves its lease (which goes with its last open) or its
/// oplock, and whoever waits on the file looks again.
pub fn drop_open(st: &mut FileState, open_id: u64, index: &mut LeaseIndex) {
    for h in st.holders.iter_mut() {
        h.opens.retain(|o| *o != open_id);
    }
    st.holders.retain(|h| {
        let keep = !h.opens.is_empty();
        if let (
            false,
            Owner::Lease {
                client_guid, key, ..
            },
        ) = (keep, h.owner)
        {
            index.remove(&(client_guid, key));
        }
        keep
    });
    st.changed.notify_waiters();
}

/// OPLOCK_BREAK acknowledgment of an oplock (MS-SMB2 3.3.5.22.1): the level must not exceed
/// the one the break went to.
pub fn acknowledge(
    server: &Server,
    open: &Arc<Open>,
    level: u8,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    {
        let mut files = server.files.lock();
        let st = files.get_mut(&open.key).ok_or(INVALID_OPLOCK_PROTOCOL)?;
        let pos = st
            .holders
            .iter()
            .position(|h| {
                h.owner
                    == Owner::Oplock {
                        open: open.volatile,
                    }
            })
            .ok_or(INVALID_OPLOCK_PROTOCOL)?;
        let h = st.holders.get_mut(pos).ok_or(INVALID_OPLOCK_PROTOCOL)?;
        let Some((target, _)) = h.breaking else {
            return Err(INVALID_OPLOCK_PROTOCOL);
        };
        let acked = lease::oplock_state(level);
        let bad = acked & !target != 0;
        // A wrong level is a protocol error; the oplock is broken all the same.
        h.state = if bad { 0 } else { acked };
        h.breaking = None;
        st.holders
            .retain(|h| !(matches!(h.owner, Owner::Oplock { .. }) && h.state == 0));
        st.changed.notify_waiters();
        if bad {
            return Err(INVALID_OPLOCK_PROTOCOL);
        }
    }
    OplockBreak::Oplock {
        oplock_level: level,
        file_id: open.file_id(),
    }
    .encode(out);
    Ok(Reply::ok())
}

/// LEASE_BREAK acknowledgment (MS-SMB2 3.3.5.22.2): the lease must be breaking and the state
/// acknowledged within the one it breaks to.
pub fn acknowledge_lease(
    server: &Server,
    client_guid: [u8; 16],
    lease_key: [u8; 16],
    state: u32,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    let file = server
        .leases
        .lock()
        .get(&(client_guid, lease_key))
        .copied()
        .ok_or(NtStatus::OBJECT_NAME_NOT_FOUND)?;
    {
        let mut files = server.files.lock();
        let st = files
            .get_mut(&file)
            .ok_or(NtStatus::OBJECT_NAME_NOT_FOUND)?;
        let h = st
            .holders
            .iter_mut()
            .find(|h| h.is_lease(&client_guid, &lease_key))
            .ok_or(NtStatus::OBJECT_NAME_NOT_FOUND)?;
        let Some((target, _)) = h.breaking else {
            return Err(UNSUCCESSFUL);
        };
        if state & !target != 0 {
            return Err(REQUEST_NOT_ACCEPTED);
        }
        h.state = state;
        h.breaking = None;
        st.changed.notify_waiters();
    }
    OplockBreak::LeaseAck {
        flags: 0,
        lease_key,
        lease_state: state,
    }
    .encode(out);
    Ok(Reply::ok())
}

#[cfg(test)]
#[path = "oplock_tests.rs"]
pub(crate) mod tests;
