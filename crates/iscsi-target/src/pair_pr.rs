//! [`PairPrStore`]: a replicated LUN's persistent reservations shared by both nodes of the HA
//! pair through the peer link (`lanes_ha::ReplicatedLun::change_shared`), behind the same
//! `scsi::PrStore` the RBD gateways use.
//!
//! A PERSISTENT RESERVE OUT loads the state, applies itself, and stores the result if the
//! state has not moved: the core installs it on the peer, then here, before the command
//! completes, so the conflict check on either node is a read of its own copy. Unit attentions
//! the change raises go to the peer's nexuses too (`notify`). Each node keeps the state in
//! `<path>.pr-pair` (version and text), written on every change; a node starting with a
//! state whose APTPL bit is clear starts empty, and a node that pairs takes the sync source's
//! state at the handshake.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use lanes_ha::{ReplicatedLun, SharedEvent};
use parking_lot::{Mutex, RwLock};
use replication::SharedOutcome;
use scsi::{NoticeFn, PrChangeFn, PrStore, StoreResult};

/// This node's view: the scsi layer's versions count installs here (they only ever grow,
/// whatever the pair's version does at a handshake); `pair` is the version both nodes agree on.
struct View {
    local: u64,
    pair: u64,
    text: Option<String>,
}

struct Inner {
    view: Mutex<View>,
    file: PathBuf,
    on_change: RwLock<Option<PrChangeFn>>,
    on_notice: RwLock<Option<NoticeFn>>,
}

/// Reservation state of one replicated LUN, shared by the pair.
pub struct PairPrStore {
    lun: Arc<ReplicatedLun>,
    inner: Arc<Inner>,
}

/// The file a node keeps its copy in, next to the backing file.
pub fn state_path(lun_path: &std::path::Path) -> PathBuf {
    let mut p = lun_path.as_os_str().to_owned();
    p.push(".pr-pair");
    p.into()
}

/// Reads a node's copy at start: `(version, state)`. A state whose APTPL bit is clear is
/// dropped (a power loss of the logical unit clears it; a node that returns to a running peer
/// takes the peer's state anyway). A missing or unreadable file is version 0, no state.
pub fn load_state(file: &std::path::Path) -> (u64, Bytes) {
    let Ok(text) = std::fs::read_to_string(file) else {
        return (0, Bytes::new());
    };
    let Some((version, state)) = text.split_once('\n') else {
        return (0, Bytes::new());
    };
    let version = version.parse().unwrap_or(0);
    if state.lines().any(|l| l == "aptpl 1") {
        (version, Bytes::copy_from_slice(state.as_bytes()))
    } else {
        (version, Bytes::new())
    }
}

fn persist(file: &std::path::Path, version: u64, state: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let tmp = file.with_extension("pr-pair.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(format!("{version}\n").as_bytes())?;
    f.write_all(state)?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)
}

impl PairPrStore {
    /// Subscribes to the pair's shared state of `lun`, whose copy lives in `file`.
    pub fn new(lun: Arc<ReplicatedLun>, file: PathBuf) -> PairPrStore {
        let (pair, payload) = lun.shared_state();
        let text = (!payload.is_empty()).then(|| String::from_utf8_lossy(&payload).into_owned());
        let inner = Arc::new(Inner {
            view: Mutex::new(View {
                local: 1,
                pair,
                text,
            }),
            file,
            on_change: RwLock::new(None),
            on_notice: RwLock::new(None),
        });
        let weak = Arc::downgrade(&inner);
        lun.subscribe_shared(Box::new(move |event| {
            if let Some(inner) = weak.upgrade() {
                inner.event(event);
            }
        }));
        PairPrStore { lun, inner }
    }
}

impl Inner {
    fn event(&self, event: SharedEvent<'_>) {
        match event {
            SharedEvent::Installed { version, payload } => {
                if let Err(e) = persist(&self.file, version, payload) {
                    tracing::warn!(file = %self.file.display(), "reservation state not saved: {e}");
                }
                let text =
                    (!payload.is_empty()).then(|| String::from_utf8_lossy(payload).into_owned());
                let local = {
                    let mut v = self.view.lock();
                    v.local += 1;
                    v.pair = version;
                    v.text = text.clone();
                    v.local
                };
                if let Some(f) = self.on_change.read().as_ref() {
                    let _ = f(Some(text.as_deref().unwrap_or("")), local);
                }
            }
            SharedEvent::Notice { payload } => {
                if let (Ok(text), Some(f)) =
                    (std::str::from_utf8(payload), self.on_notice.read().as_ref())
                {
                    let _ = f(text);
                }
            }
        }
    }
}

fn host_error(e: replication::HostError) -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, e)
}

impl PrStore for PairPrStore {
    fn load(&self) -> io::Result<(Option<String>, u64)> {
        let v = self.inner.view.lock();
        Ok((v.text.clone(), v.local))
    }

    fn store_if(&self, version: u64, text: &str) -> io::Result<StoreResult> {
        let base = {
            let v = self.inner.view.lock();
            if v.local != version {
                return Ok(StoreResult::Conflict);
            }
            v.pair
        };
        match self
            .lun
            .change_shared(base, Bytes::copy_from_slice(text.as_bytes()))
            .map_err(host_error)?
        {
            // Installed here (the subscriber ran) before the core completed it.
            SharedOutcome::Stored(_) => Ok(StoreResult::Stored(self.inner.view.lock().local)),
            SharedOutcome::Conflict => Ok(StoreResult::Conflict),
        }
    }

    fn announce(&self, _version: u64, _text: &str) -> io::Result<()> {
        // Both nodes installed the change before `store_if` returned.
        Ok(())
    }

    fn subscribe(&self, on_change: PrChangeFn) {
        *self.inner.on_change.write() = Some(on_change);
    }

    fn notify(&self, attention: &str) -> io::Result<()> {
        self.lun
            .notify_peer(Bytes::copy_from_slice(attention.as_bytes()))
            .map_err(host_error)
    }

    fn subscribe_notices(&self, on_notice: NoticeFn) {
        *self.inner.on_notice.write() = Some(on_notice);
    }

    fn shares_legacy(&self) -> bool {
        // Relative target port ids are unique across the pair, so an I_T nexus is named alike
        // on both nodes.
        true
    }
}
