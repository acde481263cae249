//! [`RadosPrStore`]: a LUN's persistent reservations in one RADOS object, `lanes.pr.IMAGE` in
//! the image's pool, shared by every gateway that exports the image. Changes are
//! compare-and-set on the object's version; each change is announced with a notification on
//! the object, which every gateway's watch takes into its logical unit before acknowledging.
//! Unit attentions for other gateways' nexuses (a PREEMPT's REGISTRATIONS PREEMPTED, a LOGICAL
//! UNIT RESET's 29/03) travel the same way, as notices the sending gateway's own watch skips.

use std::sync::{Arc, OnceLock, RwLock, Weak};

use scsi::{NoticeFn, PrChangeFn, PrStore, StoreResult};

use crate::ffi::{ObjectIo, Pool, Watch};
use crate::{Error, RbdSource};

/// How long an announcement waits for every gateway's acknowledgement.
const NOTIFY_TIMEOUT_MS: u64 = 10_000;
/// How often a broken watch is re-established before giving up (a second apart).
const REWATCH_ATTEMPTS: u32 = 30;

/// The object name for an image's reservations.
pub fn pr_object_name(image: &str) -> String {
    format!("lanes.pr.{image}")
}

struct Inner {
    object: ObjectIo,
    watch: OnceLock<Watch>,
    on_change: RwLock<Option<PrChangeFn>>,
    on_notice: RwLock<Option<NoticeFn>>,
    /// This store's name in notices, so that its own watch skips them.
    sender: String,
    name: String,
}

/// A name no other gateway's store has: the host name, the process and a counter.
fn sender_name() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!(
        "{}:{}:{}:{}",
        host.trim(),
        boot.trim(),
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// Reservation state of one RBD LUN, shared by its gateways.
pub struct RadosPrStore {
    inner: Arc<Inner>,
}

impl RadosPrStore {
    /// Creates the object if missing and watches it, through the client of the image's
    /// device when this process has it open (one client per gateway and image), else a
    /// client of its own.
    pub fn open(source: &RbdSource) -> Result<RadosPrStore, Error> {
        let conf = source.ceph_conf.display().to_string();
        let pool = match crate::device::client_of(source) {
            Some(pool) => pool,
            None => Arc::new(Pool::connect(&conf, &source.client, &[], &source.pool)?),
        };
        let name = format!("{}/{}", source.pool, pr_object_name(&source.image));
        let object = ObjectIo::open(pool, &pr_object_name(&source.image))?;
        object
            .create()
            .map_err(|e| Error::Invalid(format!("creating {name}: {e}")))?;
        let inner = Arc::new(Inner {
            object,
            watch: OnceLock::new(),
            on_change: RwLock::new(None),
            on_notice: RwLock::new(None),
            sender: sender_name(),
            name,
        });
        let (notified, broken) = (Arc::downgrade(&inner), Arc::downgrade(&inner));
        let watch = Watch::new(
            &inner.object,
            Box::new(move |payload| {
                if let Some(inner) = notified.upgrade() {
                    inner.take(payload);
                }
            }),
            Box::new(move |err| {
                let weak = broken.clone();
                // Re-watching calls librados, which the callback must not wait on.
                let _ = std::thread::Builder::new()
                    .name("lanes-pr-rewatch".into())
                    .spawn(move || rewatch(&weak, err));
            }),
        )?;
        let _ = inner.watch.set(watch);
        Ok(RadosPrStore { inner })
    }
}

impl Inner {
    /// An announcement: `VERSION\nTEXT`, or a notice: `notice SENDER\nATTENTION`. Anything
    /// else is ignored (and acknowledged).
    fn take(&self, payload: &[u8]) {
        let Ok(text) = std::str::from_utf8(payload) else {
            return;
        };
        if let Some(notice) = text.strip_prefix("notice ") {
            let Some((sender, attention)) = notice.split_once('\n') else {
                return;
            };
            if sender != self.sender {
                let on_notice = self.on_notice.read().unwrap_or_else(|e| e.into_inner());
                if let Some(f) = on_notice.as_ref() {
                    f(attention);
                }
            }
            return;
        }
        let Some((version, state)) = text.split_once('\n') else {
            return;
        };
        let Ok(version) = version.parse::<u64>() else {
            return;
        };
        self.deliver(Some(state), version);
    }

    fn deliver(&self, text: Option<&str>, version: u64) {
        let on_change = self.on_change.read().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = on_change.as_ref() {
            f(text, version);
        }
    }

    fn load(&self) -> std::io::Result<(Option<String>, u64)> {
        let (bytes, version) = self.object.read()?;
        let text = match bytes {
            Some(b) if !b.is_empty() => Some(String::from_utf8(b).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "state is not UTF-8")
            })?),
            _ => None,
        };
        Ok((text, version))
    }
}

/// Re-establishes a broken watch, then reloads the state (announcements may have been missed).
fn rewatch(weak: &Weak<Inner>, err: i32) {
    for attempt in 0..REWATCH_ATTEMPTS {
        let Some(inner) = weak.upgrade() else {
            return;
        };
        tracing::warn!(
            "watch on {} broke ({}); re-establishing",
            inner.name,
            crate::errno_text(-err)
        );
        let watched = inner.watch.get().map(Watch::rewatch);
        match (watched, inner.load()) {
            (Some(Ok(())), Ok((text, version))) => {
                inner.deliver(text.as_deref(), version);
                return;
            }
            (Some(Err(e)), _) => tracing::warn!("re-watching {}: {e}", inner.name),
            (_, Err(e)) => tracing::warn!("reloading {}: {e}", inner.name),
            (None, _) => return,
        }
        drop(inner);
        if attempt + 1 < REWATCH_ATTEMPTS {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
}

impl PrStore for RadosPrStore {
    fn load(&self) -> std::io::Result<(Option<String>, u64)> {
        self.inner.load()
    }

    fn store_if(&self, version: u64, text: &str) -> std::io::Result<StoreResult> {
        Ok(
            match self.inner.object.write_full_if(version, text.as_bytes())? {
                Some(v) => StoreResult::Stored(v),
                None => StoreResult::Conflict,
            },
        )
    }

    fn announce(&self, version: u64, text: &str) -> std::io::Result<()> {
        let watch = self
            .inner
            .watch
            .get()
            .ok_or_else(|| std::io::Error::other("no watch"))?;
        watch.notify(format!("{version}\n{text}").as_bytes(), NOTIFY_TIMEOUT_MS)
    }

    fn subscribe(&self, on_change: PrChangeFn) {
        *self
            .inner
            .on_change
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(on_change);
    }

    fn notify(&self, attention: &str) -> std::io::Result<()> {
        let watch = self
            .inner
            .watch
            .get()
            .ok_or_else(|| std::io::Error::other("no watch"))?;
        let payload = format!("notice {}\n{attention}", self.inner.sender);
        watch.notify(payload.as_bytes(), NOTIFY_TIMEOUT_MS)
    }

    fn subscribe_notices(&self, on_notice: NoticeFn) {
        *self
            .inner
            .on_notice
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(on_notice);
    }
}
