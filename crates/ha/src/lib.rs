//! The HA pair's driver: two `lanes serve` nodes export one LUN, and every write is applied on
//! both before it is acknowledged. The protocol (write ordering, fencing, dirty tracking,
//! resync) is the sans-IO core in the `replication` crate; this crate runs it on tokio for
//! one LUN:
//!
//! - one task owns the core's `Replica` and carries out its actions ([`task`]);
//! - the peer link is two TCP connections, data and control ([`link`]);
//! - the core's metadata (generations, dirty bitmap, activity log) goes to an append-only
//!   journal made durable with fdatasync on its own thread ([`journal`]);
//! - local I/O runs on the LUN's own threads, not tokio's blocking pool, where the LUN's
//!   callers wait ([`local_io`]); epoch races go to etcd through [`lanes_witness::Witness`];
//! - [`ReplicatedLun::device`] is what the SCSI layer reads and writes ([`device`]).

mod device;
pub mod journal;
mod link;
mod local_io;
mod reply;
mod shared;
mod task;

pub use shared::{SharedEvent, SharedFn};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use blockstore::BlockDevice;
use lanes_witness::{Witness, WitnessConfig};
use replication::{Alua, HostError, Replica, SharedOutcome, Stats};
use tokio::sync::{mpsc, watch};

pub use replication::Config as CoreConfig;

/// One LUN's pair settings on one node.
#[derive(Debug, Clone)]
pub struct PairConfig {
    /// This node (0 or 1); node 0 dials the peer link, node 1 accepts it.
    pub node: u8,
    /// The node that wins epoch races on a tie.
    pub preferred: u8,
    /// This node's replication listener for this LUN (used by node 1).
    pub listen: SocketAddr,
    /// The peer's replication listener for this LUN (dialed by node 0).
    pub peer: SocketAddr,
    pub witness: WitnessConfig,
    /// The per-LUN metadata journal.
    pub meta_path: PathBuf,
    /// This node's disk is new (a replacement): a journal created now starts outdated, with a
    /// generation of its own, so the survivor copies everything to it. Ignored when the
    /// journal exists.
    pub replacement: bool,
    pub core: replication::Config,
    /// The shared SCSI state this node starts with (its own persistent copy) and its version.
    pub shared: (u64, bytes::Bytes),
    /// A pass of small local applies written on the LUN's core task that takes longer than
    /// this (the file system stalled it) sends the next ones to the LUN's I/O threads for a
    /// while ([`INLINE_SLOW`] by default).
    pub inline_slow: std::time::Duration,
}

/// The default [`PairConfig::inline_slow`]: a buffered write of a few blocks into the page
/// cache takes microseconds; one that takes milliseconds waited for the disk.
pub const INLINE_SLOW: std::time::Duration = std::time::Duration::from_millis(2);

/// Why a replicated LUN cannot start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("replication settings: {0}")]
    Config(#[from] replication::ConfigError),
    #[error("the local device holds {device} bytes, the pair is configured for {configured}")]
    Size { device: u64, configured: u64 },
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error("peer-link listener {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("a replicated LUN needs a tokio runtime")]
    NoRuntime,
    #[error("cannot start the local I/O threads: {0}")]
    Threads(#[source] std::io::Error),
}

/// What `lanes status` shows of one LUN's pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairStatus {
    /// The core's state: Suspended, Paired, Alone, Outdated, ResyncSource, ResyncTarget (or
    /// Stopped, Failed once the driver ended).
    pub state: &'static str,
    pub epoch: u64,
    pub peer_connected: bool,
    /// Regions the sync source still has to copy (0 when not resyncing).
    pub resync_remaining: u64,
    /// Regions that may differ from the peer.
    pub dirty_regions: u64,
    pub alua: Alua,
    pub stats: Stats,
}

/// One replicated LUN on this node.
pub struct ReplicatedLun {
    inputs: mpsc::UnboundedSender<task::Input>,
    alua: watch::Receiver<Alua>,
    status: watch::Receiver<PairStatus>,
    device: Arc<device::ReplicatedDevice>,
    shared: Arc<shared::SharedHub>,
    task: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Generation of a new pair's journals: equal on both nodes (their new disks are equal).
const INITIAL_GENERATION: u64 = 1;

impl ReplicatedLun {
    /// Load the metadata, start the core task (and the peer-link listener on node 1). Must be
    /// called within a tokio runtime.
    pub fn start(
        cfg: PairConfig,
        local: Arc<dyn BlockDevice>,
    ) -> Result<Arc<ReplicatedLun>, Error> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        cfg.core.validate()?;
        let bs = u64::from(cfg.core.block_size);
        let configured = cfg.core.lun_blocks * bs;
        if local.size_bytes() < configured {
            return Err(Error::Size {
                device: local.size_bytes(),
                configured,
            });
        }
        let geometry = journal::Geometry {
            regions: cfg.core.regions(),
            al_slots: cfg.core.al_slots,
            extent_regions: (cfg.core.al_extent_blocks / u64::from(cfg.core.region_blocks)).max(1),
            initial_generation: if cfg.replacement {
                replication::meta::fresh_generation(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as u64)
                        ^ u64::from(std::process::id()),
                    cfg.node,
                ) | 2
            } else {
                INITIAL_GENERATION
            },
            initial_outdated: cfg.replacement,
        };
        let j = journal::Journal::open(&cfg.meta_path, geometry)?;
        let io =
            local_io::LocalIo::start("lanes-ha-io", local_io::THREADS).map_err(Error::Threads)?;
        let meta = j.meta().clone();
        let start = Instant::now();
        let mut replica = Replica::new(cfg.core.clone(), meta, 0)?;
        replica.set_shared(cfg.shared.0, cfg.shared.1.clone());
        let shared = Arc::new(shared::SharedHub::new(cfg.shared.0, cfg.shared.1.clone()));
        let (tx, rx) = mpsc::unbounded_channel();
        let (jtx, jrx) = std::sync::mpsc::channel();
        let me = tx.clone();
        let journal_thread = journal::spawn(j, jrx, move |r| {
            let _ = me.send(match r {
                Ok(t) => task::Input::Persisted(t),
                Err(e) => task::Input::JournalFailed(e.to_string()),
            });
        });
        let (link_tx, link_rx) = mpsc::unbounded_channel();
        let _guard = handle.enter();
        let acceptor = if cfg.node == 1 {
            let std = std::net::TcpListener::bind(cfg.listen).map_err(|source| Error::Listen {
                addr: cfg.listen,
                source,
            })?;
            std.set_nonblocking(true)
                .and_then(|()| tokio::net::TcpListener::from_std(std))
                .map(|l| tokio::spawn(link::accept(l, 0, link_tx.clone())))
                .map(Some)
                .map_err(|source| Error::Listen {
                    addr: cfg.listen,
                    source,
                })?
        } else {
            None
        };
        let (alua_tx, alua_rx) = watch::channel(Alua::Transitioning);
        let (status_tx, status_rx) = watch::channel(PairStatus {
            state: replica.state().name(),
            epoch: replica.epoch(),
            peer_connected: false,
            resync_remaining: 0,
            dirty_regions: replica.dirty_regions(),
            alua: Alua::Transitioning,
            stats: replica.stats(),
        });
        let driver = task::Driver {
            replica,
            start,
            node: cfg.node,
            peer: cfg.peer,
            local: local.clone(),
            block_size: bs,
            inputs: rx,
            me: tx.clone(),
            link_rx,
            link_tx,
            frames: Vec::with_capacity(64),
            journal: Some(jtx),
            journal_thread: Some(journal_thread),
            io: Some(io),
            witness: Arc::new(Witness::new(cfg.witness.clone())),
            alua: alua_tx,
            status: status_tx,
            session: None,
            next_session: 0,
            dialer: None,
            acceptor,
            writes: Default::default(),
            next_write: 1,
            queued: Default::default(),
            caws: Default::default(),
            flushes: Default::default(),
            next_flush: 1,
            local_io: 0,
            applies: Vec::new(),
            inline_off_until: None,
            inline_slow: cfg.inline_slow,
            resync_remaining: 0,
            dirty_at: None,
            dirty: 0,
            read_waiters: Vec::new(),
            shared: Default::default(),
            next_shared: 1,
            shared_hub: shared.clone(),
        };
        let task = tokio::spawn(driver.run());
        let device = Arc::new(device::ReplicatedDevice {
            inputs: tx.clone(),
            local,
            block_size: bs,
            size: configured,
        });
        Ok(Arc::new(ReplicatedLun {
            inputs: tx,
            alua: alua_rx,
            status: status_rx,
            device,
            shared,
            task: parking_lot::Mutex::new(Some(task)),
        }))
    }

    /// The replicated LUN as a block device (blocking calls: use them off the event loop).
    pub fn device(&self) -> Arc<dyn BlockDevice> {
        self.device.clone()
    }

    /// This node's copy of the shared SCSI state and its version.
    pub fn shared_state(&self) -> (u64, bytes::Bytes) {
        self.shared.get()
    }

    /// Who is told of changes of the shared state and of the peer's unit attentions (one
    /// subscriber; set before the LUN serves).
    pub fn subscribe_shared(&self, f: SharedFn) {
        self.shared.subscribe(f);
    }

    /// Replaces the shared state at version `base` with `payload` on both nodes (or on this one
    /// alone while it holds the epoch) and waits for it: `Stored(version)` once both have it
    /// (the subscriber has been told here before this returns), `Conflict` if the state moved
    /// on first. Blocks the calling thread: not on the event loop.
    pub fn change_shared(
        &self,
        base: u64,
        payload: bytes::Bytes,
    ) -> Result<SharedOutcome, HostError> {
        let (reply, rx) = std::sync::mpsc::sync_channel(1);
        self.inputs
            .send(task::Input::Shared {
                base,
                payload,
                reply,
            })
            .map_err(|_| HostError::NotReady)?;
        rx.recv().map_err(|_| HostError::NotReady)?
    }

    /// Raises unit attentions (the payload, as the SCSI layer encodes them) on the peer's
    /// nexuses and waits until the peer has them (at once without a peer). Blocking.
    pub fn notify_peer(&self, payload: bytes::Bytes) -> Result<(), HostError> {
        let (reply, rx) = std::sync::mpsc::sync_channel(1);
        self.inputs
            .send(task::Input::Notice { payload, reply })
            .map_err(|_| HostError::NotReady)?;
        rx.recv().map_err(|_| HostError::NotReady)?.map(|_| ())
    }

    /// This node's port groups' ALUA state, as the core sets it.
    pub fn alua(&self) -> watch::Receiver<Alua> {
        self.alua.clone()
    }

    pub fn status(&self) -> PairStatus {
        *self.status.borrow()
    }

    /// Changes of [`ReplicatedLun::status`].
    pub fn status_watch(&self) -> watch::Receiver<PairStatus> {
        self.status.clone()
    }

    /// Stop as a crash would (nothing is flushed beyond what the core already made durable),
    /// waiting for local I/O under way and the journal to end.
    pub async fn shutdown(&self) {
        let _ = self.inputs.send(task::Input::Shutdown);
        let task = self.task.lock().take();
        if let Some(t) = task {
            let _ = t.await;
        }
    }
}
