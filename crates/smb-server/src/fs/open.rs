//! CREATE and CLOSE: dispositions, directories, share modes between opens, delete-on-close,
//! and the MxAc and QFid create contexts.

use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use smb_proto::msg::create::{
    CLOSE_FLAG_POSTQUERY_ATTRIB, CTX_DURABLE_HANDLE_REQUEST, CTX_DURABLE_HANDLE_REQUEST_V2,
    CTX_QUERY_MAXIMAL_ACCESS, CTX_QUERY_ON_DISK_ID, CTX_REQUEST_LEASE,
};
use smb_proto::msg::create_ctx::{
    encode_durable_response_v1, encode_maximal_access_response, encode_on_disk_id_response,
    DurableResponseV2, Lease,
};
use smb_proto::msg::{
    CloseRequest, CloseResponse, CreateContext, CreateRequest, CreateResponse, FileId, Message as _,
};
use smb_proto::NtStatus;

use super::grant::GrantRequest;
use super::info::{allocation, attributes, file_times, Dos};
use super::oplock::Requester;
use super::{io_status, status};
use crate::conn::Reply;
use crate::dispatch::Ctx;
use crate::state::{FileKey, Server, Share, ShareEntry};

pub const FILE_READ_DATA: u32 = 0x0001;
pub const FILE_WRITE_DATA: u32 = 0x0002;
pub const FILE_APPEND_DATA: u32 = 0x0004;
pub const FILE_EXECUTE: u32 = 0x0020;
pub const DELETE: u32 = 0x0001_0000;
const MAXIMUM_ALLOWED: u32 = 0x0200_0000;
const GENERIC_ALL: u32 = 0x1000_0000;
const GENERIC_EXECUTE: u32 = 0x2000_0000;
const GENERIC_WRITE: u32 = 0x4000_0000;
const GENERIC_READ: u32 = 0x8000_0000;
/// Rights that change something.
const WRITE_RIGHTS: u32 = 0x0000_0002
    | 0x0000_0004
    | 0x0000_0010
    | 0x0000_0040
    | 0x0000_0100
    | DELETE
    | 0x0004_0000
    | 0x0008_0000;

const SHARE_READ: u32 = 1;
const SHARE_WRITE: u32 = 2;
const SHARE_DELETE: u32 = 4;

const SUPERSEDE: u32 = 0;
const OPEN: u32 = 1;
const CREATE: u32 = 2;
const OPEN_IF: u32 = 3;
const OVERWRITE: u32 = 4;
const OVERWRITE_IF: u32 = 5;

const OPT_DIRECTORY: u32 = 0x0000_0001;
const OPT_WRITE_THROUGH: u32 = 0x0000_0002;
const OPT_NON_DIRECTORY: u32 = 0x0000_0040;
const OPT_DELETE_ON_CLOSE: u32 = 0x0000_1000;

/// An open file or directory.
pub struct Open {
    pub persistent: u64,
    pub volatile: u64,
    /// The tree connect it belongs to (a durable reconnect moves it to another).
    pub tree_id: AtomicU32,
    pub share: Arc<Share>,
    pub path: Mutex<PathBuf>,
    /// Share-relative name, `\`-separated.
    pub name: Mutex<String>,
    pub file: std::fs::File,
    pub is_dir: bool,
    pub access: u32,
    pub share_access: u32,
    pub key: FileKey,
    pub delete_on_close: AtomicBool,
    pub write_through: bool,
    pub listing: Mutex<Option<super::dir::Listing>>,
    /// FilePositionInformation: where the last READ or WRITE ended, or what SET_INFO set.
    pub position: std::sync::atomic::AtomicU64,
    /// Closed (CLOSE, TREE_DISCONNECT, LOGOFF, the session's end): a blocking lock waiting on
    /// this open gives up.
    pub closed: AtomicBool,
    /// LOCKs done, by lock sequence index, for replays.
    pub lock_sequences: super::lock::LockSequences,
    /// The CreateGuid of its DH2Q context, for replays and reconnects.
    pub create_guid: Option<[u8; 16]>,
    /// Its durability, when granted (MS-SMB2 3.3.5.9.10).
    pub durable: Mutex<Option<super::durable::Durable>>,
    /// What its CREATE answered, for a replayed CREATE.
    pub created: Mutex<super::durable::Created>,
    /// Open.ChannelSequence and its outstanding request counts (MS-SMB2 3.3.5.2.10).
    pub channel: Mutex<super::replay::ChannelState>,
    /// Its CREATE may still be replayed: no other request has used the open yet.
    pub replayable: AtomicBool,
}

impl Open {
    pub fn file_id(&self) -> FileId {
        FileId {
            persistent: self.persistent,
            volatile: self.volatile,
        }
    }
    pub fn tree(&self) -> u32 {
        self.tree_id.load(Ordering::Relaxed)
    }
    pub fn can_read(&self) -> bool {
        self.access & (FILE_READ_DATA | FILE_EXECUTE) != 0
    }
    pub fn can_write(&self) -> bool {
        self.access & (FILE_WRITE_DATA | FILE_APPEND_DATA) != 0
    }
}

/// GENERIC_* and MAXIMUM_ALLOWED mapped to file rights (MS-SMB2 3.3.5.9, MS-FSA 2.1.5.1).
fn map_access(desired: u32, maximal: u32) -> u32 {
    let mut a = desired & 0x01FF_FFFF & !MAXIMUM_ALLOWED;
    if desired & GENERIC_READ != 0 {
        a |= 0x0012_0089;
    }
    if desired & GENERIC_WRITE != 0 {
        a |= 0x0012_0116;
    }
    if desired & GENERIC_EXECUTE != 0 {
        a |= 0x0012_00A0;
    }
    if desired & GENERIC_ALL != 0 {
        a |= 0x001F_01FF;
    }
    if desired & MAXIMUM_ALLOWED != 0 {
        a |= maximal;
    }
    a
}

const FILE_READ_ATTRIBUTES: u32 = 0x0080;
const FILE_WRITE_ATTRIBUTES: u32 = 0x0100;
const READ_CONTROL: u32 = 0x0002_0000;
const SYNCHRONIZE: u32 = 0x0010_0000;

/// A "stat open" as oplocks see it: attributes and SYNCHRONIZE only. It breaks no oplock
/// and does not count as another open when one is granted (Windows; smbtorture
/// smb2.oplock.statopen1: READ_CONTROL, the EA rights, WRITE_DAC and WRITE_OWNER do break).
pub fn oplock_stat_open(access: u32) -> bool {
    access & !(FILE_READ_ATTRIBUTES | FILE_WRITE_ATTRIBUTES | SYNCHRONIZE) == 0
}

/// A "stat open" as leases see it: as for oplocks, and READ_CONTROL too (smb2.lease.statopen4).
pub fn lease_stat_open(access: u32) -> bool {
    access & !(FILE_READ_ATTRIBUTES | FILE_WRITE_ATTRIBUTES | SYNCHRONIZE | READ_CONTROL) == 0
}

pub fn conflicts(new_access: u32, new_share: u32, old: &ShareEntry) -> bool {
    let data = |a: u32| {
        a & (FILE_READ_DATA | FILE_EXECUTE | FILE_WRITE_DATA | FILE_APPEND_DATA | DELETE) != 0
    };
    if !data(new_access) || !data(old.access) {
        return false;
    }
    let denies = |access: u32, share: u32| {
        (access & (FILE_READ_DATA | FILE_EXECUTE) != 0 && share & SHARE_READ == 0)
            || (access & (FILE_WRITE_DATA | FILE_APPEND_DATA) != 0 && share & SHARE_WRITE == 0)
            || (access & DELETE != 0 && share & SHARE_DELETE == 0)
    };
    denies(new_access, old.share_access) || denies(old.access, new_share)
}

/// The existing file a CREATE names and what it asks of that file's lease and oplock
/// holders, for the breaks before the CREATE proper.
pub fn requester(ctx: &Ctx<'_>, req: &CreateRequest<'_>) -> Option<(FileKey, Requester)> {
    let share = ctx.tree.share.as_ref()?;
    let name = req.name_string().ok()?;
    let m = super::path::resolve(&share.root, &name).ok()?.meta?;
    let maximal = if share.read_only {
        crate::tree::ACCESS_READ_ONLY
    } else {
        crate::tree::ACCESS_ALL
    };
    let lease_key = lease_request(req).map(|l| l.key());
    Some((
        (m.dev(), m.ino()),
        Requester {
            client_guid: ctx.session.client_guid,
            lease_key,
            access: map_access(req.desired_access, maximal),
            share_access: req.share_access,
            overwrite: matches!(req.create_disposition, SUPERSEDE | OVERWRITE | OVERWRITE_IF),
            delete_on_close: req.create_options & OPT_DELETE_ON_CLOSE != 0,
        },
    ))
}

/// The lease a CREATE asks for: an RqLs context counts only with SMB2_OPLOCK_LEVEL_LEASE
/// (MS-SMB2 3.3.5.9.8); one that does not decode is ignored.
fn lease_request(req: &CreateRequest<'_>) -> Option<Lease> {
    if req.requested_oplock_level != super::lease::OPLOCK_LEASE {
        return None;
    }
    Lease::decode(req.context(CTX_REQUEST_LEASE)?.data).ok()
}

/// The argument checks of MS-SMB2 3.3.5.9, with Samba's statuses.
fn check_request(req: &CreateRequest<'_>) -> Result<(), NtStatus> {
    const BAD_IMPERSONATION_LEVEL: NtStatus = NtStatus(0xC000_00A5);
    const OPEN_BY_FILE_ID: u32 = 0x0000_2000;
    const INVALID_OPTIONS: u32 = 0xFF10_0000;
    const VALID_ATTRIBUTES: u32 = 0x0000_7FB7;
    if req.impersonation_level > 3 {
        return Err(BAD_IMPERSONATION_LEVEL);
    }
    if req.create_options & INVALID_OPTIONS != 0
        || req.share_access > 7
        || req.create_disposition > OVERWRITE_IF
        || req.file_attributes & !VALID_ATTRIBUTES != 0
        || (req.create_options & OPT_DIRECTORY != 0 && req.create_options & OPT_NON_DIRECTORY != 0)
    {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if req.create_options & OPEN_BY_FILE_ID != 0 {
        return Err(NtStatus::NOT_SUPPORTED);
    }
    if req.desired_access & 0x0CE0_FE00 != 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    Ok(())
}

pub fn create(
    ctx: &Ctx<'_>,
    req: &CreateRequest<'_>,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    let Some(share) = ctx.tree.share.clone() else {
        // IPC$: no named pipes are served.
        return Err(NtStatus::OBJECT_NAME_NOT_FOUND);
    };
    let name = req.name_string().map_err(|_| status::OBJECT_NAME_INVALID)?;
    check_request(req)?;
    let ask = super::durable::DurableAsk::parse(req)?;
    if name.starts_with('\\') {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let disposition = req.create_disposition;
    let opts = req.create_options;
    if disposition > OVERWRITE_IF || (opts & OPT_DIRECTORY != 0 && opts & OPT_NON_DIRECTORY != 0) {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let maximal = if share.read_only {
        crate::tree::ACCESS_READ_ONLY
    } else {
        crate::tree::ACCESS_ALL
    };
    let access = map_access(req.desired_access, maximal);
    if access == 0 && req.desired_access & MAXIMUM_ALLOWED == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    if opts & OPT_DELETE_ON_CLOSE != 0 && access & DELETE == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    let creates = !matches!(disposition, OPEN);
    if share.read_only
        && (access & WRITE_RIGHTS != 0
            || (creates && disposition != OPEN_IF)
            || opts & OPT_DELETE_ON_CLOSE != 0)
    {
        return Err(NtStatus::ACCESS_DENIED);
    }
    if ctx.session.state.lock().opens.len() >= crate::state::MAX_OPENS {
        return Err(NtStatus::INSUFFICIENT_RESOURCES);
    }
    if let Some(tw) = req.context(smb_proto::msg::create::CTX_TIMEWARP) {
        // A previous version (MS-SMB2 3.3.5.9.6): none are kept, so there is none at any time.
        smb_proto::msg::create_ctx::decode_u64_context(tw.data)
            .map_err(|_| NtStatus::INVALID_PARAMETER)?;
        return Err(NtStatus::OBJECT_NAME_NOT_FOUND);
    }
    let r = super::path::resolve(&share.root, &name)?;
    let want_dir = opts & OPT_DIRECTORY != 0;
    let lease = lease_request(req);
    if let Some(l) = &lease {
        // A lease key names one file per client (MS-SMB2 3.3.5.9.8).
        let file = r.meta.as_ref().map(|m| (m.dev(), m.ino()));
        let used = ctx
            .server
            .leases
            .lock()
            .get(&(ctx.session.client_guid, l.key()))
            .copied();
        if used.is_some_and(|k| Some(k) != file) {
            return Err(NtStatus::INVALID_PARAMETER);
        }
    }
    let (action, file, meta) = match &r.meta {
        Some(m) => {
            if disposition == CREATE {
                return Err(status::OBJECT_NAME_COLLISION);
            }
            if m.is_dir() && opts & OPT_NON_DIRECTORY != 0 {
                return Err(status::FILE_IS_A_DIRECTORY);
            }
            if !m.is_dir() && want_dir {
                return Err(status::NOT_A_DIRECTORY);
            }
            let overwrite = matches!(disposition, SUPERSEDE | OVERWRITE | OVERWRITE_IF);
            if m.is_dir() && overwrite {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            if share.read_only && overwrite {
                return Err(NtStatus::ACCESS_DENIED);
            }
            let writable = !share.read_only
                && !m.is_dir()
                && (access & (FILE_WRITE_DATA | FILE_APPEND_DATA) != 0 || overwrite);
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(writable)
                .open(&r.path)
                .map_err(|e| io_status(&e))?;
            let action = match disposition {
                SUPERSEDE => 0,
                OVERWRITE | OVERWRITE_IF => 3,
                _ => 1,
            };
            (action, f, m.clone())
        }
        None => {
            if matches!(disposition, OPEN | OVERWRITE) {
                return Err(NtStatus::OBJECT_NAME_NOT_FOUND);
            }
            let f = if want_dir {
                std::fs::create_dir(&r.path).map_err(|e| io_status(&e))?;
                std::fs::File::open(&r.path).map_err(|e| io_status(&e))?
            } else {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&r.path)
                    .map_err(|e| io_status(&e))?
            };
            let m = f.metadata().map_err(|e| io_status(&e))?;
            (2, f, m)
        }
    };
    let key = (meta.dev(), meta.ino());
    let id = ctx.server.new_id();
    let granted;
    {
        let mut files = ctx.server.files.lock();
        let st = files.entry(key).or_default();
        if st.delete_pending {
            return Err(status::DELETE_PENDING);
        }
        if st
            .entries
            .iter()
            .any(|e| conflicts(access, req.share_access, e))
        {
            if st.entries.is_empty() {
                files.remove(&key);
            }
            return Err(status::SHARING_VIOLATION);
        }
        st.entries.push(ShareEntry {
            open: id,
            access,
            share_access: req.share_access,
        });
        granted = super::grant::grant(
            st,
            key,
            id,
            &GrantRequest {
                requested_oplock: req.requested_oplock_level,
                lease,
                client_guid: ctx.session.client_guid,
                session_id: ctx.session.id,
                tx: ctx.tx,
                is_dir: meta.is_dir(),
            },
            &mut ctx.server.leases.lock(),
        );
    }
    let caching = match &granted.lease {
        Some(Lease::V1 { state, .. } | Lease::V2 { state, .. }) => *state,
        None => super::lease::oplock_state(granted.oplock_level),
    };
    let durable = ask.grant(caching, meta.is_dir());
    let open = Arc::new(Open {
        persistent: id,
        volatile: id,
        tree_id: AtomicU32::new(ctx.tree.id),
        share,
        path: Mutex::new(r.path),
        name: Mutex::new(r.name),
        is_dir: meta.is_dir(),
        file,
        access,
        share_access: req.share_access,
        key,
        delete_on_close: AtomicBool::new(opts & OPT_DELETE_ON_CLOSE != 0),
        write_through: opts & OPT_WRITE_THROUGH != 0,
        listing: Mutex::new(None),
        position: std::sync::atomic::AtomicU64::new(0),
        closed: AtomicBool::new(false),
        lock_sequences: Default::default(),
        create_guid: ask.create_guid(),
        durable: Mutex::new(durable),
        created: Mutex::new(Default::default()),
        channel: Mutex::new(super::replay::ChannelState {
            sequence: ctx.channel_sequence,
            ..Default::default()
        }),
        replayable: AtomicBool::new(true),
    });
    if action == 3 || action == 0 {
        if let Err(e) = open.file.set_len(0) {
            release(ctx.server, &open);
            return Err(io_status(&e));
        }
    }
    if action != 1 {
        // New or overwritten: the attributes the client asked for (ARCHIVE at least for files).
        let mut attrs = req.file_attributes & super::info::ATTR_KEPT;
        if !open.is_dir {
            attrs |= super::info::ATTR_ARCHIVE;
        }
        let dos = Dos {
            attrs: Some(attrs),
            ..Dos::default()
        };
        if attrs != super::info::ATTR_ARCHIVE || (open.is_dir && attrs != 0) {
            let _ = dos.store(&open.file);
        }
    }
    if let Some(size) = req
        .context(smb_proto::msg::create::CTX_ALLOCATION_SIZE)
        .and_then(|c| smb_proto::msg::create_ctx::decode_u64_context(c.data).ok())
    {
        if action != 1 && !open.is_dir && size > 0 {
            let _ =
                rustix::fs::fallocate(&open.file, rustix::fs::FallocateFlags::KEEP_SIZE, 0, size);
        }
    }
    if action != 1 {
        ctx.server.changed(&open.path.lock());
    }
    let meta = open.file.metadata().unwrap_or(meta);
    let dos = Dos::of_file(&open.file);
    let mut ctx_data: Vec<(&[u8], Vec<u8>)> = Vec::new();
    if req.context(CTX_QUERY_MAXIMAL_ACCESS).is_some() {
        let mut d = Vec::with_capacity(8);
        encode_maximal_access_response(0, maximal, &mut d);
        ctx_data.push((CTX_QUERY_MAXIMAL_ACCESS, d));
    }
    if req.context(CTX_QUERY_ON_DISK_ID).is_some() {
        let mut disk = [0u8; 16];
        disk[..8].copy_from_slice(&meta.ino().to_le_bytes());
        disk[8..].copy_from_slice(&meta.dev().to_le_bytes());
        let mut d = Vec::with_capacity(32);
        encode_on_disk_id_response(disk, meta.dev(), &mut d);
        ctx_data.push((CTX_QUERY_ON_DISK_ID, d));
    }
    if let Some(l) = &granted.lease {
        let mut d = Vec::with_capacity(52);
        l.encode(&mut d);
        ctx_data.push((CTX_REQUEST_LEASE, d));
    }
    match durable {
        Some(d) if d.v2 => {
            let mut b = Vec::with_capacity(8);
            DurableResponseV2 {
                timeout: d.timeout_ms,
                flags: 0,
            }
            .encode(&mut b);
            ctx_data.push((CTX_DURABLE_HANDLE_REQUEST_V2, b));
        }
        Some(_) => {
            let mut b = Vec::with_capacity(8);
            encode_durable_response_v1(&mut b);
            ctx_data.push((CTX_DURABLE_HANDLE_REQUEST, b));
        }
        None => {}
    }
    let contexts: Vec<CreateContext<'_>> = ctx_data
        .iter()
        .map(|(n, d)| CreateContext { name: n, data: d })
        .collect();
    let fid = open.file_id();
    let created = super::durable::Created {
        action,
        times: file_times(&meta, &dos),
        allocation_size: allocation(&meta),
        end_of_file: if meta.is_dir() { 0 } else { meta.len() },
        file_attributes: attributes(&meta, &dos),
    };
    *open.created.lock() = created;
    CreateResponse {
        oplock_level: granted.oplock_level,
        flags: 0,
        create_action: action,
        times: created.times,
        allocation_size: created.allocation_size,
        end_of_file: created.end_of_file,
        file_attributes: created.file_attributes,
        file_id: fid,
        contexts,
    }
    .encode(out);
    super::durable::register(ctx, &ask, &open);
    ctx.session.state.lock().opens.insert(id, open);
    Ok(Reply {
        file_id: Some(fid),
        ..Reply::ok()
    })
}

pub fn close(
    ctx: &Ctx<'_>,
    open: &Arc<Open>,
    req: &CloseRequest,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    ctx.session.state.lock().opens.remove(&open.volatile);
    let mut resp = CloseResponse::default();
    if req.flags & CLOSE_FLAG_POSTQUERY_ATTRIB != 0 {
        if let Ok(m) = open.file.metadata() {
            let dos = Dos::of_file(&open.file);
            resp.flags = CLOSE_FLAG_POSTQUERY_ATTRIB;
            resp.times = file_times(&m, &dos);
            resp.allocation_size = allocation(&m);
            resp.end_of_file = if m.is_dir() { 0 } else { m.len() };
            resp.file_attributes = attributes(&m, &dos);
        }
    }
    close_open(ctx.server, open);
    resp.encode(out);
    Ok(Reply::ok())
}

/// Drops an open's share-mode entry and its locks; the last open of a file with a pending
/// delete removes it.
pub fn close_open(server: &Server, open: &Open) {
    open.closed.store(true, Ordering::Release);
    super::durable::unregister(server, open);
    server.locks.release_open(open.key, open.volatile);
    if open.delete_on_close.load(Ordering::Relaxed) {
        if let Some(st) = server.files.lock().get_mut(&open.key) {
            st.delete_pending = true;
        }
    }
    release(server, open);
}

fn release(server: &Server, open: &Open) {
    let delete = {
        let mut files = server.files.lock();
        let Some(st) = files.get_mut(&open.key) else {
            return;
        };
        st.entries.retain(|e| e.open != open.volatile);
        super::oplock::drop_open(st, open.volatile, &mut server.leases.lock());
        if st.entries.is_empty() {
            let pending = st.delete_pending;
            files.remove(&open.key);
            pending
        } else {
            false
        }
    };
    if delete {
        let path = open.path.lock().clone();
        let r = if open.is_dir {
            std::fs::remove_dir(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match r {
            Ok(()) => server.changed(&path),
            Err(e) => tracing::debug!(path = %path.display(), "SMB delete on close: {e}"),
        }
    }
}
