//! Server-wide state and its ownership: the server owns the shares, the session table (shared
//! by every channel, so a bound connection finds its session) and the per-file tables of share
//! modes and byte-range locks. A session owns its tree connects and opens; a connection owns
//! only its channels' keys and its pending async requests.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use smb_proto::crypto::{Cipher, SessionKeys, SigningAlgorithm};
use smb_proto::msg::FileId;

use crate::config::SmbConfig;
use crate::fs::lock::LockTable;
use crate::users::Users;

/// Most channels one session may have (MS-SMB2 3.3.5.5.2 lets the server choose).
pub const MAX_CHANNELS: usize = 32;
/// Bounds on what one peer can make the server hold: authentications in progress per
/// connection, tree connects and opens per session (each open holds a file descriptor).
pub const MAX_PENDING_AUTH: usize = 16;
pub const MAX_TREES: usize = 1024;
pub const MAX_OPENS: usize = 16384;

/// An exported directory.
#[derive(Debug)]
pub struct Share {
    pub name: String,
    /// The canonical share root.
    pub root: PathBuf,
    pub read_only: bool,
    pub users: Vec<String>,
    /// Removed or changed by a reload: its tree connects answer NETWORK_NAME_DELETED and new
    /// ones get the share as configured now.
    pub retired: AtomicBool,
}

impl Share {
    pub fn new(name: String, root: PathBuf, read_only: bool, users: Vec<String>) -> Share {
        Share {
            name,
            root,
            read_only,
            users,
            retired: AtomicBool::new(false),
        }
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    pub fn allows(&self, user: &str) -> bool {
        self.users.is_empty() || self.users.iter().any(|u| u.eq_ignore_ascii_case(user))
    }
}

/// A file's identity on the server's filesystem.
pub type FileKey = (u64, u64);

/// A lease key as the server knows it: the client's GUID and the key (MS-SMB2 3.3.1.4: keys
/// are unique per client).
pub type LeaseId = ([u8; 16], [u8; 16]);
/// Where each lease key's file is.
pub type LeaseIndex = HashMap<LeaseId, FileKey>;

/// One open's entry in the share-mode table.
#[derive(Debug, Clone, Copy)]
pub struct ShareEntry {
    pub open: u64,
    pub access: u32,
    pub share_access: u32,
}

/// What every open of one file shares: the share-mode entries and the delete-pending bit.
#[derive(Debug, Default)]
pub struct FileState {
    pub entries: Vec<ShareEntry>,
    pub delete_pending: bool,
    /// Leases and oplocks on the file.
    pub holders: Vec<crate::fs::oplock::Holder>,
    /// Woken when holders or opens change (an acknowledgment, a close, a timeout), for the
    /// CREATEs waiting on a break.
    pub changed: Arc<tokio::sync::Notify>,
}

/// A pending CHANGE_NOTIFY: its final answer (STATUS_NOTIFY_ENUM_DIR, built, signed or
/// encrypted when it was registered) goes out on the first change in `dir`.
pub struct Watch {
    pub dir: PathBuf,
    pub tree: bool,
    pub done: Arc<AtomicBool>,
    pub frame: Vec<u8>,
    pub tx: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
}

pub struct Server {
    pub config: SmbConfig,
    pub watches: Mutex<Vec<Watch>>,
    /// CHANGE_NOTIFYs answered by a change (for tests and diagnostics).
    pub notified: AtomicU64,
    /// The shares and users as configured now (a reload replaces each list as a whole).
    shares: RwLock<Arc<Vec<Arc<Share>>>>,
    users: RwLock<Arc<Users>>,
    pub server_guid: [u8; 16],
    pub start_time: u64,
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    pub files: Mutex<HashMap<FileKey, FileState>>,
    /// Lease keys (per client GUID) and the file each is on; locked after `files`, never
    /// before it.
    pub leases: Mutex<LeaseIndex>,
    pub locks: LockTable,
    /// Durable opens whose session is gone, by persistent FileId (`fs::durable`).
    pub orphans: Mutex<HashMap<u64, crate::fs::durable::Orphan>>,
    /// Notified whenever opens become orphans (a reconnect racing its old connection's end).
    pub orphaned: tokio::sync::Notify,
    /// CreateGuids of opens and of CREATEs waiting for breaks, for replays and reconnects.
    pub create_guids: Mutex<crate::fs::durable::GuidTable>,
    /// Open connections with their counters, and the server-wide counters (`lanes status`,
    /// `/metrics`).
    pub conns: crate::stats::ConnTable,
    pub counters: crate::stats::Counters,
    next_id: AtomicU64,
}

impl Server {
    pub fn new(config: SmbConfig, shares: Vec<Arc<Share>>, users: Users) -> Server {
        let server_guid: [u8; 16] = rand::random();
        Server {
            config,
            shares: RwLock::new(Arc::new(shares)),
            users: RwLock::new(Arc::new(users)),
            server_guid,
            start_time: crate::wire::now_filetime(),
            sessions: Mutex::new(HashMap::new()),
            watches: Mutex::new(Vec::new()),
            notified: AtomicU64::new(0),
            files: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
            locks: LockTable::default(),
            orphans: Mutex::new(HashMap::new()),
            orphaned: tokio::sync::Notify::new(),
            create_guids: Mutex::new(HashMap::new()),
            conns: crate::stats::ConnTable::default(),
            counters: crate::stats::Counters::default(),
            // Random high bits keep ids of different server runs apart.
            next_id: AtomicU64::new((u64::from(rand::random::<u16>()) << 40) | 1),
        }
    }

    /// A fresh non-zero id for sessions and opens.
    pub fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn share(&self, name: &str) -> Option<Arc<Share>> {
        self.shares
            .read()
            .iter()
            .find(|s| s.name.eq_ignore_ascii_case(name))
            .cloned()
    }

    /// The shares as configured now.
    pub fn shares(&self) -> Arc<Vec<Arc<Share>>> {
        self.shares.read().clone()
    }

    /// The users as configured now.
    pub fn users(&self) -> Arc<Users> {
        self.users.read().clone()
    }

    /// Replaces the shares and users (a reload's last step; `crate::reload`).
    pub(crate) fn set_shares_and_users(&self, shares: Vec<Arc<Share>>, users: Arc<Users>) {
        *self.shares.write() = Arc::new(shares);
        *self.users.write() = users;
    }

    pub fn session(&self, id: u64) -> Option<Arc<Session>> {
        self.sessions.lock().get(&id).cloned()
    }
    pub fn add_session(&self, s: Arc<Session>) {
        self.sessions.lock().insert(s.id, s);
    }
    pub fn remove_session(&self, id: u64) -> Option<Arc<Session>> {
        self.sessions.lock().remove(&id)
    }
    pub fn watch(&self, w: Watch) {
        let mut list = self.watches.lock();
        list.retain(|w| !w.done.load(Ordering::Relaxed));
        list.push(w);
    }

    /// Something at `path` changed (created, deleted, renamed, resized, retimed): the
    /// CHANGE_NOTIFYs on its directory (or above it, with WATCH_TREE) complete.
    pub fn changed(&self, path: &std::path::Path) {
        let mut list = self.watches.lock();
        for w in list.iter() {
            let hit = path.parent() == Some(w.dir.as_path())
                || (w.tree && path != w.dir && path.starts_with(&w.dir));
            if hit && !w.done.swap(true, Ordering::AcqRel) {
                self.notified.fetch_add(1, Ordering::Relaxed);
                let _ = w.tx.send(w.frame.clone());
            }
        }
        list.retain(|w| !w.done.load(Ordering::Relaxed));
    }

    pub fn session_count(&self) -> usize {
        self.sessions.lock().len()
    }

    /// Every session, for status.
    pub fn sessions_snapshot(&self) -> Vec<Arc<Session>> {
        self.sessions.lock().values().cloned().collect()
    }
}

/// An authenticated session, shared by its channels.
pub struct Session {
    pub id: u64,
    pub user: String,
    pub dialect: u16,
    pub client_guid: [u8; 16],
    pub signing: SigningAlgorithm,
    pub cipher: Option<Cipher>,
    pub keys: SessionKeys,
    /// Session.SessionKey, for the channel signing keys of bound connections.
    pub session_key: [u8; 16],
    pub signing_required: bool,
    pub state: Mutex<SessionState>,
    pub closed: AtomicBool,
    /// Channels bound after the first one, and channels lost while the session lived on.
    pub binds: AtomicU64,
    pub channels_lost: AtomicU64,
}

#[derive(Default)]
pub struct SessionState {
    pub trees: HashMap<u32, Arc<Tree>>,
    pub opens: HashMap<u64, Arc<crate::fs::open::Open>>,
    pub next_tree: u32,
    pub channels: usize,
    /// The writers of the session's channels, for break notifications whose own connection
    /// is gone.
    pub channel_tx: Vec<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>,
    /// The counters of the connections that are the session's channels.
    pub channel_stats: Vec<Arc<crate::stats::ConnStats>>,
}

impl Session {
    pub fn tree(&self, id: u32) -> Option<Arc<Tree>> {
        self.state.lock().trees.get(&id).cloned()
    }
    /// The open `fid` names, if it belongs to tree `tree`.
    pub fn open(&self, fid: FileId, tree: u32) -> Option<Arc<crate::fs::open::Open>> {
        let st = self.state.lock();
        st.opens
            .get(&fid.volatile)
            .filter(|o| o.persistent == fid.persistent && o.tree() == tree)
            .cloned()
    }
}

/// A tree connect: a share or IPC$.
pub struct Tree {
    pub id: u32,
    /// None for IPC$.
    pub share: Option<Arc<Share>>,
    pub read_only: bool,
}
