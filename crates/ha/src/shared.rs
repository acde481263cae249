//! The pair's shared SCSI state (persistent reservations) as the SCSI layer sees it: a copy
//! kept current by the core task, a subscriber told of every change and of the peer's unit
//! attentions, and blocking calls that change the state on both nodes or reach the peer's
//! nexuses. What the bytes mean is the SCSI layer's business (`lanes_iscsi_target::pair_pr`).

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

/// What the core task reports to the subscriber.
#[derive(Debug, Clone, Copy)]
pub enum SharedEvent<'a> {
    /// The local copy changed (a change from either node, or the sync source's snapshot).
    Installed { version: u64, payload: &'a Bytes },
    /// Unit attentions the peer raised for this node's I_T nexuses.
    Notice { payload: &'a Bytes },
}

/// Called on the LUN's core task; it must take the change before it returns (the peer's
/// change is acknowledged, and a notice answered, only after).
pub type SharedFn = Box<dyn Fn(SharedEvent<'_>) + Send + Sync>;

/// This node's copy and its subscriber.
pub(crate) struct SharedHub {
    state: Mutex<(u64, Bytes)>,
    subscriber: RwLock<Option<SharedFn>>,
}

impl SharedHub {
    pub fn new(version: u64, payload: Bytes) -> SharedHub {
        SharedHub {
            state: Mutex::new((version, payload)),
            subscriber: RwLock::new(None),
        }
    }

    pub fn get(&self) -> (u64, Bytes) {
        self.state.lock().clone()
    }

    pub fn subscribe(&self, f: SharedFn) {
        *self.subscriber.write() = Some(f);
    }

    pub fn installed(&self, version: u64, payload: Bytes) {
        *self.state.lock() = (version, payload.clone());
        if let Some(f) = self.subscriber.read().as_ref() {
            f(SharedEvent::Installed {
                version,
                payload: &payload,
            });
        }
    }

    pub fn notice(&self, payload: &Bytes) {
        if let Some(f) = self.subscriber.read().as_ref() {
            f(SharedEvent::Notice { payload });
        }
    }
}
