//! Durable handles (MS-SMB2 3.3.5.9.6, 3.3.5.9.7, 3.3.5.9.10, 3.3.5.9.12): which CREATEs get
//! durability, the opens kept after their session is lost (orphans, each with a deadline after
//! which a scavenger task closes it), the reconnect that gives an orphan to a new session, and
//! the purge of orphans that stand in another client's way. Replayed CREATEs are in `replay`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use smb_proto::msg::create::{
    FileTimes, CTX_APP_INSTANCE_ID, CTX_DURABLE_HANDLE_RECONNECT, CTX_DURABLE_HANDLE_RECONNECT_V2,
    CTX_DURABLE_HANDLE_REQUEST, CTX_DURABLE_HANDLE_REQUEST_V2, CTX_REQUEST_LEASE,
};
use smb_proto::msg::create_ctx::{
    decode_app_instance_id, decode_durable_reconnect_v1, decode_durable_request_v1,
    DurableReconnectV2, DurableRequestV2, Lease,
};
use smb_proto::msg::{CreateContext, CreateRequest, CreateResponse, FileId, Message as _};
use smb_proto::NtStatus;
use tokio::time::Instant;

use super::info::{allocation, attributes, file_times, Dos};
use super::lease;
use super::open::Open;
use super::oplock::{Owner, Requester};
use crate::conn::Reply;
use crate::dispatch::Ctx;
use crate::state::{FileKey, Server};

/// The timeout when DH2Q asks for 0, and the most a client gets (as Samba: 60 s and 300 s).
pub const DEFAULT_TIMEOUT_MS: u32 = 60_000;
pub const MAX_TIMEOUT_MS: u32 = 300_000;
/// Most orphaned opens kept server-wide; beyond it a lost session's opens close.
pub const MAX_ORPHANS: usize = 16384;

/// An open's durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durable {
    /// Granted through DH2Q (else DHnQ).
    pub v2: bool,
    pub timeout_ms: u32,
}

/// The fixed part of a CREATE's answer, kept for replays of that CREATE.
#[derive(Debug, Clone, Copy, Default)]
pub struct Created {
    pub action: u32,
    pub times: FileTimes,
    pub allocation_size: u64,
    pub end_of_file: u64,
    pub file_attributes: u32,
}

/// An open whose session is gone, kept until `deadline` for a reconnect.
pub struct Orphan {
    pub open: Arc<Open>,
    pub user: String,
    pub client_guid: [u8; 16],
    pub deadline: Instant,
}

/// Who holds a CreateGuid: a CREATE still waiting for breaks, or an open.
#[derive(Clone)]
pub enum GuidEntry {
    Pending {
        client_guid: [u8; 16],
    },
    Open {
        client_guid: [u8; 16],
        session_id: u64,
        app_instance: Option<[u8; 16]>,
        open: Arc<Open>,
    },
}

/// CreateGuid to its holder (MS-SMB2 3.3.1.10 GlobalOpenTable, looked up by CreateGuid).
pub type GuidTable = HashMap<[u8; 16], GuidEntry>;

/// The durable-handle contexts of a CREATE.
#[derive(Debug, Default, Clone, Copy)]
pub struct DurableAsk {
    pub v1: bool,
    pub v2: Option<DurableRequestV2>,
    pub reconnect_v1: Option<FileId>,
    pub reconnect_v2: Option<DurableReconnectV2>,
    pub app_instance: Option<[u8; 16]>,
}

impl DurableAsk {
    /// The contexts, with the combinations MS-SMB2 3.3.5.9 refuses (INVALID_PARAMETER): v1
    /// beside v2, DH2Q beside DH2C, or a body of the wrong size. DHnQ beside DHnC is ignored
    /// (3.3.5.9.7).
    pub fn parse(req: &CreateRequest<'_>) -> Result<DurableAsk, NtStatus> {
        let bad = |_| NtStatus::INVALID_PARAMETER;
        let data = |name: &[u8]| req.context(name).map(|c| c.data);
        let ask = DurableAsk {
            v1: match data(CTX_DURABLE_HANDLE_REQUEST) {
                Some(d) => decode_durable_request_v1(d).map(|()| true).map_err(bad)?,
                None => false,
            },
            v2: data(CTX_DURABLE_HANDLE_REQUEST_V2)
                .map(DurableRequestV2::decode)
                .transpose()
                .map_err(bad)?,
            reconnect_v1: data(CTX_DURABLE_HANDLE_RECONNECT)
                .map(decode_durable_reconnect_v1)
                .transpose()
                .map_err(bad)?,
            reconnect_v2: data(CTX_DURABLE_HANDLE_RECONNECT_V2)
                .map(DurableReconnectV2::decode)
                .transpose()
                .map_err(bad)?,
            app_instance: data(CTX_APP_INSTANCE_ID)
                .map(decode_app_instance_id)
                .transpose()
                .map_err(bad)?,
        };
        let asks = [
            ask.v1,
            ask.v2.is_some(),
            ask.reconnect_v1.is_some(),
            ask.reconnect_v2.is_some(),
        ];
        let v1_pair =
            ask.v1 && ask.reconnect_v1.is_some() && asks.iter().filter(|a| **a).count() == 2;
        if asks.iter().filter(|a| **a).count() > 1 && !v1_pair {
            return Err(NtStatus::INVALID_PARAMETER);
        }
        Ok(ask)
    }

    pub fn is_reconnect(&self) -> bool {
        self.reconnect_v1.is_some() || self.reconnect_v2.is_some()
    }

    /// The FileId a DH2C or DHnC names, with the CreateGuid a DH2C carries.
    pub fn reconnect_target(&self) -> Option<(FileId, Option<[u8; 16]>)> {
        match (self.reconnect_v2, self.reconnect_v1) {
            (Some(r), _) => Some((r.file_id, Some(r.create_guid))),
            (None, Some(f)) => Some((f, None)),
            (None, None) => None,
        }
    }

    /// A non-zero CreateGuid of a DH2Q context.
    pub fn create_guid(&self) -> Option<[u8; 16]> {
        self.v2.map(|d| d.create_guid).filter(|g| *g != [0; 16])
    }

    /// The durability to grant a new open given the caching it got: a batch oplock or a
    /// lease with handle caching (MS-SMB2 3.3.5.9.6, 3.3.5.9.10); persistence is not offered.
    pub fn grant(&self, caching: u32, is_dir: bool) -> Option<Durable> {
        if is_dir || caching & lease::H == 0 {
            return None;
        }
        if let Some(d) = self.v2 {
            let timeout_ms = match d.timeout {
                0 => DEFAULT_TIMEOUT_MS,
                t => t.min(MAX_TIMEOUT_MS),
            };
            return Some(Durable {
                v2: true,
                timeout_ms,
            });
        }
        self.v1.then_some(Durable {
            v2: false,
            timeout_ms: DEFAULT_TIMEOUT_MS,
        })
    }
}

/// The lease or oplock state an open holds on its file, and the lease itself.
pub fn caching_of(server: &Server, open: &Open) -> (u32, Option<(Owner, u16)>) {
    let files = server.files.lock();
    let Some(st) = files.get(&open.key) else {
        return (0, None);
    };
    st.holders
        .iter()
        .find(|h| h.opens.contains(&open.volatile))
        .map_or((0, None), |h| (h.state, Some((h.owner, h.epoch))))
}

/// The RqLs answer for a lease `owner` in `state`, shaped as the request's context was.
pub fn lease_answer(asked: &Lease, owner: Owner, state: u32, epoch: u16) -> Option<Lease> {
    let Owner::Lease { key, parent, .. } = owner else {
        return None;
    };
    Some(match asked {
        Lease::V1 { .. } => Lease::V1 {
            key,
            state,
            flags: 0,
        },
        Lease::V2 { .. } => Lease::V2 {
            key,
            state,
            flags: if parent.is_some() {
                smb_proto::msg::create_ctx::LEASE_FLAG_PARENT_LEASE_KEY_SET
            } else {
                0
            },
            parent_key: parent.unwrap_or_default(),
            epoch,
        },
    })
}

/// Records a new open's CreateGuid (a DH2Q context's), replacing a pending entry.
pub fn register(ctx: &Ctx<'_>, ask: &DurableAsk, open: &Arc<Open>) {
    if let Some(guid) = ask.create_guid() {
        ctx.server.create_guids.lock().insert(
            guid,
            GuidEntry::Open {
                client_guid: ctx.session.client_guid,
                session_id: ctx.session.id,
                app_instance: ask.app_instance,
                open: open.clone(),
            },
        );
    }
}

/// An open goes: its CreateGuid with it.
pub fn unregister(server: &Server, open: &Open) {
    let Some(guid) = open.create_guid else {
        return;
    };
    let mut t = server.create_guids.lock();
    if matches!(t.get(&guid), Some(GuidEntry::Open { open: o, .. }) if std::ptr::eq(Arc::as_ptr(o), open))
    {
        t.remove(&guid);
    }
}

/// A CREATE with this CreateGuid waits for breaks (MS-SMB2 3.3.5.9.10: a replay of it meanwhile
/// answers FILE_NOT_AVAILABLE), or no longer does.
pub fn set_pending(server: &Server, client_guid: [u8; 16], guid: [u8; 16], pending: bool) {
    let mut t = server.create_guids.lock();
    if pending {
        t.entry(guid).or_insert(GuidEntry::Pending { client_guid });
    } else if matches!(t.get(&guid), Some(GuidEntry::Pending { .. })) {
        t.remove(&guid);
    }
}

/// A new open with an AppInstanceId closes the other opens of that application instance
/// (MS-SMB2 3.3.5.9.13), before its own share-mode check.
pub fn close_app_instance(server: &Arc<Server>, ask: &DurableAsk) {
    let (Some(app), Some(guid)) = (ask.app_instance, ask.create_guid()) else {
        return;
    };
    let victims: Vec<(u64, Arc<Open>)> = server
        .create_guids
        .lock()
        .iter()
        .filter_map(|(g, e)| match e {
            GuidEntry::Open {
                session_id,
                app_instance: Some(a),
                open,
                ..
            } if *a == app && *g != guid => Some((*session_id, open.clone())),
            _ => None,
        })
        .collect();
    for (session_id, open) in victims {
        let removed = server
            .session(session_id)
            .and_then(|s| s.state.lock().opens.remove(&open.volatile));
        let orphan = server.orphans.lock().remove(&open.persistent);
        if removed.is_some() || orphan.is_some() {
            super::open::close_open(server, &open);
        }
    }
}

/// A session ends with its connection (or is replaced): its durable opens stay for their
/// timeout, the others close. Each orphan gets a scavenger task.
pub fn orphan_or_close(
    server: &Arc<Server>,
    user: &str,
    client_guid: [u8; 16],
    opens: Vec<Arc<Open>>,
) {
    for open in opens {
        let durable = *open.durable.lock();
        // An open whose lease or oplock is being broken is not kept: nobody is left to
        // acknowledge the break, and the CREATE that caused it waits for this open to close
        // (a connection that ends while the break is on its way: otherwise the CREATE would
        // wait out the break timeout, and get less than the open it asked for).
        let kept = durable
            .filter(|_| !open.closed.load(Ordering::Acquire))
            .filter(|_| !breaking(server, &open))
            .and_then(|d| {
                let mut orphans = server.orphans.lock();
                if orphans.len() >= MAX_ORPHANS {
                    return None;
                }
                let deadline = Instant::now() + Duration::from_millis(u64::from(d.timeout_ms));
                orphans.insert(
                    open.persistent,
                    Orphan {
                        open: open.clone(),
                        user: user.to_string(),
                        client_guid,
                        deadline,
                    },
                );
                Some(deadline)
            });
        match kept {
            Some(deadline) => {
                tracing::debug!(
                    "SMB durable open {:#x} kept until its reconnect or timeout",
                    open.persistent
                );
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let server = server.clone();
                    rt.spawn(async move {
                        tokio::time::sleep_until(deadline).await;
                        expire(&server, Instant::now());
                    });
                }
            }
            None => super::open::close_open(server, &open),
        }
    }
    server.orphaned.notify_waiters();
}

/// Whether a break of the lease or oplock `open` is under is waiting for its acknowledgment.
fn breaking(server: &Server, open: &Open) -> bool {
    server.files.lock().get(&open.key).is_some_and(|st| {
        st.holders
            .iter()
            .any(|h| h.breaking.is_some() && h.opens.contains(&open.volatile))
    })
}

/// Closes the orphans whose deadline has passed; returns how many.
pub fn expire(server: &Server, now: Instant) -> usize {
    let gone: Vec<Orphan> = {
        let mut orphans = server.orphans.lock();
        let ids: Vec<u64> = orphans
            .iter()
            .filter(|(_, o)| o.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        ids.iter().filter_map(|id| orphans.remove(id)).collect()
    };
    for o in &gone {
        tracing::debug!("SMB durable open {:#x} expired", o.open.persistent);
        super::open::close_open(server, &o.open);
    }
    gone.len()
}

/// Before another CREATE of file `key`: orphans that would make it wait for a break (their
/// lease or oplock caches handles or writes) or fail with a sharing violation are closed, as
/// no client is there to answer (Samba does the same).
pub fn purge_conflicting(server: &Server, key: FileKey, req: &Requester) {
    let candidates: Vec<Arc<Open>> = server
        .orphans
        .lock()
        .values()
        .filter(|o| o.open.key == key)
        .map(|o| o.open.clone())
        .collect();
    if candidates.is_empty() {
        return;
    }
    let victims: Vec<Arc<Open>> = {
        let files = server.files.lock();
        let Some(st) = files.get(&key) else {
            return;
        };
        candidates
            .into_iter()
            .filter(|o| {
                let shares = st.entries.iter().any(|e| {
                    e.open == o.volatile && super::open::conflicts(req.access, req.share_access, e)
                });
                let caches = st.holders.iter().any(|h| {
                    !h.stat_open(req.access)
                        && h.opens.contains(&o.volatile)
                        && !h.owned_by(req)
                        && h.state & (lease::H | lease::W) != 0
                });
                shares || caches
            })
            .collect()
    };
    for open in victims {
        if server.orphans.lock().remove(&open.persistent).is_some() {
            tracing::debug!(
                "SMB durable open {:#x} purged by a conflicting open",
                open.persistent
            );
            super::open::close_open(server, &open);
        }
    }
}

/// How long a reconnect waits for the connection that still holds its open to end.
pub const RECONNECT_WAIT: Duration = Duration::from_secs(1);

/// Before a DH2C or DHnC: when the open it names is still held by another session, whose
/// connection the client has left but whose end this server has not yet read (a client
/// reconnects within a few round trips of closing its socket; a busy server may not have
/// run the old connection's task yet), wait up to [`RECONNECT_WAIT`] for it to become an
/// orphan. An open still in use after that fails the reconnect as before.
pub async fn await_orphan(server: &Server, session: &crate::state::Session, persistent: u64) {
    let held_elsewhere = || {
        !server.orphans.lock().contains_key(&persistent)
            && server.sessions_snapshot().iter().any(|s| {
                s.id != session.id
                    && s.user.eq_ignore_ascii_case(&session.user)
                    && s.state
                        .lock()
                        .opens
                        .values()
                        .any(|o| o.persistent == persistent && o.durable.lock().is_some())
            })
    };
    let deadline = tokio::time::Instant::now() + RECONNECT_WAIT;
    loop {
        let orphaned = server.orphaned.notified();
        tokio::pin!(orphaned);
        orphaned.as_mut().enable();
        if !held_elsewhere() {
            return;
        }
        if tokio::time::timeout_at(deadline, orphaned).await.is_err() {
            tracing::debug!(
                "SMB durable reconnect of {persistent:#x}: its open is still in use by another session"
            );
            return;
        }
    }
}

/// DH2C or DHnC (MS-SMB2 3.3.5.9.7, 3.3.5.9.12): an orphan goes to this session and tree.
/// The other fields of the CREATE are ignored, except the name when the open has a lease.
pub fn reconnect(
    ctx: &Ctx<'_>,
    req: &CreateRequest<'_>,
    ask: &DurableAsk,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    let not_found = NtStatus::OBJECT_NAME_NOT_FOUND;
    let (fid, guid) = ask.reconnect_target().ok_or(NtStatus::INVALID_PARAMETER)?;
    let share = ctx.tree.share.as_ref().ok_or(not_found)?;
    let (open, user) = {
        let orphans = ctx.server.orphans.lock();
        let o = orphans.get(&fid.persistent).ok_or(not_found)?;
        (o.open.clone(), o.user.clone())
    };
    if open.durable.lock().is_none() {
        return Err(not_found);
    }
    // DHnC may reconnect a DH2Q open too, from any client GUID; DH2C needs the open's
    // CreateGuid, zero for a DHnQ open (as Samba).
    if guid.is_some_and(|g| open.create_guid.unwrap_or_default() != g) {
        return Err(not_found);
    }
    if !Arc::ptr_eq(&open.share, share) {
        return Err(not_found);
    }
    let (state, holder) = caching_of(ctx.server, &open);
    let asked = req
        .context(CTX_REQUEST_LEASE)
        .and_then(|c| Lease::decode(c.data).ok());
    let lease = match (holder, asked) {
        (
            Some((
                owner @ Owner::Lease {
                    client_guid: g,
                    key,
                    ..
                },
                epoch,
            )),
            Some(a),
        ) => {
            if a.key() != key || g != ctx.session.client_guid {
                return Err(not_found);
            }
            let name = req.name_string().map_err(|_| not_found)?;
            if !name.eq_ignore_ascii_case(&open.name.lock()) {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            lease_answer(&a, owner, state, epoch)
        }
        (Some((Owner::Lease { .. }, _)), None) | (_, Some(_)) => return Err(not_found),
        _ => None,
    };
    if !user.eq_ignore_ascii_case(&ctx.session.user) {
        return Err(NtStatus::ACCESS_DENIED);
    }
    if ctx.server.orphans.lock().remove(&fid.persistent).is_none() {
        return Err(not_found);
    }
    open.tree_id.store(ctx.tree.id, Ordering::Relaxed);
    {
        let mut files = ctx.server.files.lock();
        if let Some(st) = files.get_mut(&open.key) {
            for h in st
                .holders
                .iter_mut()
                .filter(|h| h.opens.contains(&open.volatile))
            {
                h.session_id = ctx.session.id;
                h.tx = ctx.tx.clone();
            }
        }
    }
    if let Some(g) = open.create_guid {
        ctx.server.create_guids.lock().insert(
            g,
            GuidEntry::Open {
                client_guid: ctx.session.client_guid,
                session_id: ctx.session.id,
                app_instance: None,
                open: open.clone(),
            },
        );
    }
    ctx.session
        .state
        .lock()
        .opens
        .insert(open.volatile, open.clone());
    tracing::debug!("SMB durable open {:#x} reconnected", open.persistent);
    let meta = open.file.metadata().map_err(|e| super::io_status(&e))?;
    let dos = Dos::of_file(&open.file);
    let mut data = Vec::new();
    if let Some(l) = &lease {
        l.encode(&mut data);
    }
    let contexts = if lease.is_some() {
        vec![CreateContext {
            name: CTX_REQUEST_LEASE,
            data: &data,
        }]
    } else {
        Vec::new()
    };
    CreateResponse {
        oplock_level: if lease.is_some() {
            lease::OPLOCK_LEASE
        } else {
            lease::oplock_level(state)
        },
        flags: 0,
        create_action: 1,
        times: file_times(&meta, &dos),
        allocation_size: allocation(&meta),
        end_of_file: if meta.is_dir() { 0 } else { meta.len() },
        file_attributes: attributes(&meta, &dos),
        file_id: open.file_id(),
        contexts,
    }
    .encode(out);
    Ok(Reply {
        file_id: Some(open.file_id()),
        ..Reply::ok()
    })
}

#[cfg(test)]
#[path = "durable_tests.rs"]
pub(crate) mod tests;
