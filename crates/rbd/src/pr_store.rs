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

/// The RADOS object where the gateways of `image` publish their client addresses.
pub fn gateways_object_name(image: &str) -> String {
    format!("lanes.gw.{image}")
}

struct Inner {
    object: ObjectIo,
    /// `lanes.gw.IMAGE`: each gateway's client address under `client.GID`, so a gateway that
    /// stops answering can be fenced by address.
    gateways: ObjectIo,
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
        let object = ObjectIo::open(pool.clone(), &pr_object_name(&source.image))?;
        object
            .create()
            .map_err(|e| Error::Invalid(format!("creating {name}: {e}")))?;
        let gateways = ObjectIo::open(pool, &gateways_object_name(&source.image))?;
        let published = gateways.create().and_then(|()| {
            let (gid, addr) = gateways.client_identity()?;
            gateways.set_xattr(&format!("client.{gid}"), &addr)
        });
        published.map_err(|e| {
            Error::Invalid(format!(
                "publishing this gateway's client address in {}/{}: {e}",
                source.pool,
                gateways_object_name(&source.image)
            ))
        })?;
        let inner = Arc::new(Inner {
            object,
            gateways,
            watch: OnceLock::new(),
            on_change: RwLock::new(None),
            on_notice: RwLock::new(None),
            sender: sender_name(),
            name,
        });
        let (notified, broken) = (Arc::downgrade(&inner), Arc::downgrade(&inner));
        let watch = Watch::new(
            &inner.object,
            Box::new(move |payload| match notified.upgrade() {
                Some(inner) => inner.take(payload),
                None => true,
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
    /// else is ignored (and acknowledged). Returns whether to acknowledge: a reset notice
    /// whose commands under way here did not end in time is not.
    fn take(&self, payload: &[u8]) -> bool {
        let Ok(text) = std::str::from_utf8(payload) else {
            return true;
        };
        if let Some(notice) = text.strip_prefix("notice ") {
            let Some((sender, attention)) = notice.split_once('\n') else {
                return true;
            };
            if sender != self.sender {
                let on_notice = self.on_notice.read().unwrap_or_else(|e| e.into_inner());
                if let Some(f) = on_notice.as_ref() {
                    return f(attention);
                }
            }
            return true;
        }
        let Some((version, state)) = text.split_once('\n') else {
            return true;
        };
        let Ok(version) = version.parse::<u64>() else {
            return true;
        };
        self.deliver(Some(state), version)
    }

    /// Sends `payload` to every gateway's watch; a gateway that does not acknowledge in time
    /// is fenced (its client blocklisted) before this returns, so whatever it still has in
    /// flight can never land after what follows (the stale-write race of tcmu-runner issue
    /// 420). An error when it could not be fenced.
    fn tell_all(&self, payload: &[u8]) -> std::io::Result<()> {
        let watch = self
            .watch
            .get()
            .ok_or_else(|| std::io::Error::other("no watch"))?;
        let silent = watch.notify(payload, NOTIFY_TIMEOUT_MS)?;
        if silent.is_empty() {
            return Ok(());
        }
        for (gid, cookie) in silent {
            let addr = self
                .gateways
                .get_xattr(&format!("client.{gid}"))?
                .ok_or_else(|| {
                    std::io::Error::other(format!(
                        "client.{gid} (watch {cookie}) did not answer and has no address in {}: \
                         cannot fence it",
                        self.name
                    ))
                })?;
            tracing::warn!(
                object = %self.name,
                "gateway client.{gid} at {addr} did not answer within {NOTIFY_TIMEOUT_MS} ms: \
                 blocklisting it (ceph osd blocklist add {addr})"
            );
            self.object
                .blocklist(&addr, std::time::Duration::from_millis(NOTIFY_TIMEOUT_MS))?;
        }
        Ok(())
    }

    /// Hands a new state to the logical unit; whether to acknowledge it (false: a change that
    /// took access away while commands here did not end in time).
    fn deliver(&self, text: Option<&str>, version: u64) -> bool {
        let on_change = self.on_change.read().unwrap_or_else(|e| e.into_inner());
        match on_change.as_ref() {
            Some(f) => f(text, version),
            None => true,
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
                let _ = inner.deliver(text.as_deref(), version);
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
        self.inner.tell_all(format!("{version}\n{text}").as_bytes())
    }

    fn subscribe(&self, on_change: PrChangeFn) {
        *self
            .inner
            .on_change
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(on_change);
    }

    fn notify(&self, attention: &str) -> std::io::Result<()> {
        let payload = format!("notice {}\n{attention}", self.inner.sender);
        self.inner.tell_all(payload.as_bytes())
    }

    fn drains_on_reset(&self) -> bool {
        true
    }

    fn subscribe_notices(&self, on_notice: NoticeFn) {
        *self
            .inner
            .on_notice
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(on_notice);
    }
}
