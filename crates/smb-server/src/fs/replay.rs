//! Replay detection (MS-SMB2 3.3.5.2.10, 3.3.5.9.10): a CREATE replayed with
//! SMB2_FLAGS_REPLAY_OPERATION and the CreateGuid of an open of this session gets that open
//! back instead of a second one; the ChannelSequence of WRITE, SET_INFO and IOCTL on an open
//! is checked against Open.ChannelSequence.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use smb_proto::msg::create::CTX_DURABLE_HANDLE_REQUEST_V2;
use smb_proto::msg::create::CTX_REQUEST_LEASE;
use smb_proto::msg::create_ctx::{DurableResponseV2, Lease};
use smb_proto::msg::{CreateContext, CreateRequest, CreateResponse, Message as _};
use smb_proto::NtStatus;

use super::durable::{caching_of, lease_answer, DurableAsk, GuidEntry};
use super::lease;
use super::open::Open;
use super::oplock::Owner;
use crate::conn::Reply;
use crate::dispatch::Ctx;

pub const FILE_NOT_AVAILABLE: NtStatus = NtStatus(0xC000_0467);
pub const DUPLICATE_OBJECTID: NtStatus = NtStatus(0xC000_022A);

/// Open.ChannelSequence, Open.OutstandingRequestCount and Open.OutstandingPreRequestCount.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChannelState {
    pub sequence: u16,
    pub outstanding: u32,
    pub pre_outstanding: u32,
}

/// A request counted in its open's ChannelState; uncounted when dropped.
pub struct InFlight {
    open: Arc<Open>,
    sequence: u16,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut c = self.open.channel.lock();
        if c.sequence == self.sequence {
            c.outstanding = c.outstanding.saturating_sub(1);
        } else {
            c.pre_outstanding = c.pre_outstanding.saturating_sub(1);
        }
    }
}

/// MS-SMB2 3.3.5.2.10 for a request on `open` with `sequence` in its header: the same
/// sequence counts as outstanding, a newer one (16-bit difference up to 0x7FFF) becomes
/// Open.ChannelSequence. For a request that `modifies` (WRITE, SET_INFO, IOCTL) an older one
/// answers FILE_NOT_AVAILABLE, as does a replay while requests of an older sequence are
/// still outstanding; other requests with an older one go on uncounted. Any request on the
/// open also ends the replay of its CREATE.
pub fn begin(
    open: &Arc<Open>,
    sequence: u16,
    replay: bool,
    modifies: bool,
) -> Result<Option<InFlight>, NtStatus> {
    open.replayable.store(false, Ordering::Relaxed);
    let mut c = open.channel.lock();
    if sequence == c.sequence {
        if modifies && replay && c.pre_outstanding > 0 {
            return Err(FILE_NOT_AVAILABLE);
        }
        c.outstanding += 1;
    } else if sequence.wrapping_sub(c.sequence) <= 0x7FFF {
        if modifies && replay && c.pre_outstanding + c.outstanding > 0 {
            return Err(FILE_NOT_AVAILABLE);
        }
        c.pre_outstanding += c.outstanding;
        c.outstanding = 1;
        c.sequence = sequence;
    } else if modifies {
        return Err(FILE_NOT_AVAILABLE);
    } else {
        return Ok(None);
    }
    Ok(Some(InFlight {
        open: open.clone(),
        sequence,
    }))
}

/// A CREATE with a DH2Q CreateGuid already known to this session (MS-SMB2 3.3.5.9.10):
/// without the replay flag it answers DUPLICATE_OBJECTID; with it, a CREATE still waiting for breaks answers
/// FILE_NOT_AVAILABLE and an open of this session and tree not yet used by another request
/// is answered again (no second open). None: a CREATE like any other.
pub fn replayed_create(
    ctx: &Ctx<'_>,
    req: &CreateRequest<'_>,
    ask: &DurableAsk,
    replay: bool,
    out: &mut Vec<u8>,
) -> Option<Result<Reply, NtStatus>> {
    let guid = ask.create_guid()?;
    let entry = ctx.server.create_guids.lock().get(&guid).cloned()?;
    let open = match entry {
        GuidEntry::Pending { client_guid } => {
            return (replay && client_guid == ctx.session.client_guid)
                .then_some(Err(FILE_NOT_AVAILABLE));
        }
        // Another client's or another session's open with that CreateGuid is not this one's.
        GuidEntry::Open {
            client_guid,
            session_id,
            ..
        } if client_guid != ctx.session.client_guid || session_id != ctx.session.id => return None,
        GuidEntry::Open { .. } if !replay => return Some(Err(DUPLICATE_OBJECTID)),
        GuidEntry::Open { open, .. } => open,
    };
    if !open.replayable.load(Ordering::Relaxed) {
        return None;
    }
    let live = ctx
        .session
        .state
        .lock()
        .opens
        .get(&open.volatile)
        .is_some_and(|o| Arc::ptr_eq(o, &open));
    if !live || open.tree() != ctx.tree.id {
        return None;
    }
    Some(answer(ctx, req, ask, &open, out))
}

/// The replay's answer: the first answer's FileId, action, times, sizes and attributes; the
/// open's present lease state; the oplock level asked for, at most the one held; durability
/// as that level allows. A lease asked for on an oplock open, or another key, is refused.
fn answer(
    ctx: &Ctx<'_>,
    req: &CreateRequest<'_>,
    ask: &DurableAsk,
    open: &Open,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    let (state, holder) = caching_of(ctx.server, open);
    let asked = (req.requested_oplock_level == lease::OPLOCK_LEASE)
        .then(|| req.context(CTX_REQUEST_LEASE))
        .flatten()
        .and_then(|c| Lease::decode(c.data).ok());
    let (oplock_level, lease, caching) = match (holder, asked) {
        (Some((owner @ Owner::Lease { key, .. }, epoch)), Some(a)) if a.key() == key => (
            lease::OPLOCK_LEASE,
            lease_answer(&a, owner, state, epoch),
            state,
        ),
        (Some((Owner::Lease { .. }, _)), _) | (_, Some(_)) => {
            return Err(NtStatus::ACCESS_DENIED);
        }
        _ => {
            let held = lease::oplock_level(state);
            let level = req.requested_oplock_level.min(held);
            (level, None, lease::oplock_state(level))
        }
    };
    let durable =
        (*open.durable.lock()).filter(|d| d.v2 && ask.grant(caching, open.is_dir).is_some());
    let mut lease_data = Vec::new();
    if let Some(l) = &lease {
        l.encode(&mut lease_data);
    }
    let mut dh2q = Vec::new();
    if let Some(d) = durable {
        DurableResponseV2 {
            timeout: d.timeout_ms,
            flags: 0,
        }
        .encode(&mut dh2q);
    }
    let mut contexts = Vec::new();
    if lease.is_some() {
        contexts.push(CreateContext {
            name: CTX_REQUEST_LEASE,
            data: &lease_data,
        });
    }
    if durable.is_some() {
        contexts.push(CreateContext {
            name: CTX_DURABLE_HANDLE_REQUEST_V2,
            data: &dh2q,
        });
    }
    let c = *open.created.lock();
    CreateResponse {
        oplock_level,
        flags: 0,
        create_action: c.action,
        times: c.times,
        allocation_size: c.allocation_size,
        end_of_file: c.end_of_file,
        file_attributes: c.file_attributes,
        file_id: open.file_id(),
        contexts,
    }
    .encode(out);
    Ok(Reply {
        file_id: Some(open.file_id()),
        ..Reply::ok()
    })
}
