//! [`RadosPrStore`]: a LUN's persistent reservations in one RADOS object, `lanes.pr.IMAGE` in
//! the image's pool, shared by every gateway that exports the image. Changes are
//! compare-and-set on the object's version; each change is announced with a notification on
//! the object, which every gateway's watch takes into its logical unit before acknowledging.
//! Unit attentions for other gateways' nexuses (a PREEMPT's REGISTRATIONS PREEMPTED, a LOGICAL
//! UNIT RESET's 29/03) travel the same way, as notices the sending gateway's own watch skips.
//!
//! The watches are the gateways' heartbeats: each gateway publishes its client address in
//! `lanes.gw.IMAGE` once its watch is up, and its client pings the watch every half second.
//! An OSD drops the watch of a gateway that stopped pinging (killed, paused, cut off from the
//! cluster) after the LUN's `watch-timeout` ([`RbdSource::watch_timeout_s`]). Every announcement must be acknowledged by
//! every published gateway: one that did not (it timed out, or its watch was dropped) is
//! blocklisted, and its address unpublished, before the announcement completes. So a change
//! never waits longer than the watch timeout for a dead gateway, and a paused one can never
//! land a write it held after what follows. A gateway also publishes which process it is
//! ([`Incarnation`]): one restarted on the same machine blocklists the client its dead
//! predecessor left published as it starts, so the others do not wait out that watch.

use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use arc_swap::ArcSwap;

use scsi::{NoticeFn, PrChangeFn, PrStore, StoreResult};

use crate::ffi::{ObjectIo, Pool, Watch};
use crate::incarnation::{Incarnation, Liveness};
use crate::{Error, RbdSource};

/// How long an announcement waits for every gateway's acknowledgement.
const NOTIFY_TIMEOUT_MS: u64 = 10_000;
/// An announcement slower than this is logged with who answered (a slow gateway holds up every
/// reservation change).
const SLOW_NOTIFY: std::time::Duration = std::time::Duration::from_secs(1);
/// What librados answers a blocklisted client.
const ESHUTDOWN: i32 = 108;
/// How often a broken watch is re-established before giving up (a second apart).
const REWATCH_ATTEMPTS: u32 = 30;

/// `lanes.gw.IMAGE` attributes: `client.GID` holds a gateway's client address, `process.GID`
/// the gateway process that published it ([`Incarnation`]), `alua.GID` its target port groups
/// and their states (`port_groups.rs`).
const CLIENT: &str = "client.";
const PROCESS: &str = "process.";
pub(crate) const ALUA: &str = "alua.";

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
    /// This gateway's client: its global id (it never fences itself) and address.
    gid: u64,
    watch: OnceLock<Watch>,
    callbacks: Arc<Callbacks>,
    /// This store's name in notices, so that its own watch skips them.
    sender: String,
    name: String,
    /// Seconds of silence after which the OSDs drop a gateway's watch.
    watch_timeout_s: u32,
}

/// The logical unit's subscriptions: they outlive a client (a reconnect keeps them).
#[derive(Default)]
struct Callbacks {
    on_change: RwLock<Option<PrChangeFn>>,
    on_notice: RwLock<Option<NoticeFn>>,
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
    shared: Arc<Shared>,
}

/// The store's state on its current client, swapped whole when the gateway reconnects.
struct Shared {
    inner: ArcSwap<Inner>,
    callbacks: Arc<Callbacks>,
    /// Which image, for the registry below.
    key: String,
}

/// The stores open in this process, by image: a device that reconnects moves its image's
/// store to the new client ([`move_to_client`]).
static STORES: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

impl RadosPrStore {
    /// Creates the object if missing and watches it, through the client of the image's
    /// device when this process has it open (one client per gateway and image), else a
    /// client of its own.
    pub fn open(source: &RbdSource) -> Result<RadosPrStore, Error> {
        let conf = source.ceph_conf.display().to_string();
        let pool = match crate::device::client_of(source) {
            Some(pool) => pool,
            None => Arc::new(Pool::connect(
                &conf,
                &source.client,
                &crate::device::CLIENT_OPTIONS,
                &source.pool,
            )?),
        };
        let callbacks = Arc::new(Callbacks::default());
        let inner = Inner::open(pool, source, callbacks.clone())?;
        let shared = Arc::new(Shared {
            inner: ArcSwap::new(inner),
            callbacks,
            key: crate::device::client_key(source),
        });
        let mut stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
        stores.retain(|s| s.strong_count() > 0);
        stores.push(Arc::downgrade(&shared));
        Ok(RadosPrStore { shared })
    }

    fn inner(&self) -> arc_swap::Guard<Arc<Inner>> {
        self.shared.inner.load()
    }
}

/// Moves the reservation store of `source` (if one is open) to the new client `pool`: a
/// watch on the new client, the state read again and handed to the logical unit, the new
/// client published. Until this returns the device stays fenced, so no command runs on a
/// state that may have missed changes while this gateway was cut off.
pub(crate) fn move_to_client(source: &RbdSource, pool: &Arc<Pool>) -> Result<(), Error> {
    let key = crate::device::client_key(source);
    let shared = {
        let stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
        stores
            .iter()
            .filter_map(Weak::upgrade)
            .find(|s| s.key == key)
    };
    let Some(shared) = shared else {
        return Ok(());
    };
    let inner = Inner::open(pool.clone(), source, shared.callbacks.clone())?;
    let (text, version) = inner
        .load()
        .map_err(|e| Error::Invalid(format!("reading {}: {e}", inner.name)))?;
    let _ = inner.deliver(text.as_deref(), version);
    shared.inner.store(inner);
    Ok(())
}

impl Inner {
    /// The store on client `pool`: the object created if missing, watched, and this client
    /// published once the watch is up (from then on every announcement waits for this
    /// gateway's acknowledgement, or fences it).
    fn open(
        pool: Arc<Pool>,
        source: &RbdSource,
        callbacks: Arc<Callbacks>,
    ) -> Result<Arc<Inner>, Error> {
        let name = format!("{}/{}", source.pool, pr_object_name(&source.image));
        let object = ObjectIo::open(pool.clone(), &pr_object_name(&source.image))?;
        object
            .create()
            .map_err(|e| Error::Invalid(format!("creating {name}: {e}")))?;
        let gateways = ObjectIo::open(pool, &gateways_object_name(&source.image))?;
        let publishing = |e: std::io::Error| {
            Error::Invalid(format!(
                "publishing this gateway's client address in {}/{}: {e}",
                source.pool,
                gateways_object_name(&source.image)
            ))
        };
        gateways.create().map_err(publishing)?;
        let (gid, addr) = gateways.client_identity().map_err(publishing)?;
        let me = Incarnation::this();
        if let Some(me) = &me {
            fence_gone_predecessors(&object, &gateways, gid, me, &name);
        }
        let inner = Arc::new(Inner {
            object,
            gateways,
            gid,
            watch: OnceLock::new(),
            callbacks,
            sender: sender_name(),
            name,
            watch_timeout_s: source.watch_timeout_s,
        });
        let (notified, broken) = (Arc::downgrade(&inner), Arc::downgrade(&inner));
        let watch = Watch::new(
            &inner.object,
            source.watch_timeout_s,
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
        if let Some(me) = &me {
            inner
                .gateways
                .set_xattr(&format!("{PROCESS}{gid}"), &me.to_string())
                .map_err(publishing)?;
        }
        inner
            .gateways
            .set_xattr(&format!("{CLIENT}{gid}"), &addr)
            .map_err(publishing)?;
        Ok(inner)
    }

    /// An announcement: `VERSION\nTEXT`, or a notice: `notice SENDER\nATTENTION`. Anything
    /// else is ignored (and acknowledged). Returns whether to acknowledge: a reset notice
    /// whose commands under way here did not end in time is not.
    fn take(&self, payload: &[u8]) -> bool {
        let started = std::time::Instant::now();
        let ack = self.take_now(payload);
        let took = started.elapsed();
        if took > SLOW_NOTIFY {
            tracing::warn!(
                object = %self.name,
                gateway = %format!("client.{}", self.gid),
                "taking an announcement took {took:?} (acknowledged: {ack})"
            );
        }
        ack
    }

    fn take_now(&self, payload: &[u8]) -> bool {
        let Ok(text) = std::str::from_utf8(payload) else {
            return true;
        };
        if let Some(notice) = text.strip_prefix("notice ") {
            let Some((sender, attention)) = notice.split_once('\n') else {
                return true;
            };
            if sender != self.sender {
                let on_notice = self
                    .callbacks
                    .on_notice
                    .read()
                    .unwrap_or_else(|e| e.into_inner());
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

    /// Sends `payload` to every gateway's watch. Every published gateway that does not
    /// acknowledge (it timed out, or the OSD dropped its silent watch) is fenced, its client
    /// blocklisted and its address unpublished, before this returns, so whatever it still has
    /// in flight can never land after what follows (the stale-write race of tcmu-runner issue
    /// 420). An error when one could not be fenced.
    fn tell_all(&self, payload: &[u8]) -> std::io::Result<()> {
        let watch = self
            .watch
            .get()
            .ok_or_else(|| std::io::Error::other("no watch"))?;
        let started = std::time::Instant::now();
        let reply = watch.notify(payload, NOTIFY_TIMEOUT_MS)?;
        let waited = started.elapsed();
        if waited > SLOW_NOTIFY {
            tracing::warn!(
                object = %self.name,
                gateway = %format!("client.{}", self.gid),
                "an announcement waited {waited:?} for the other gateways (acknowledged by {:?}, \
                 timed out: {:?})",
                reply.acked.iter().map(|(gid, _)| *gid).collect::<Vec<_>>(),
                reply.timed_out.iter().map(|(gid, _)| *gid).collect::<Vec<_>>(),
            );
        }
        let acked: Vec<u64> = reply.acked.iter().map(|(gid, _)| *gid).collect();
        let published: Vec<(u64, String)> = self
            .gateways
            .xattrs(CLIENT)?
            .into_iter()
            .filter_map(|(key, addr)| Some((key.strip_prefix(CLIENT)?.parse().ok()?, addr)))
            .collect();
        for (gid, cookie) in &reply.timed_out {
            if !published.iter().any(|(g, _)| g == gid) {
                return Err(std::io::Error::other(format!(
                    "client.{gid} (watch {cookie}) did not answer and has no address in {}: \
                     cannot fence it",
                    self.name
                )));
            }
        }
        for (gid, addr) in published {
            if gid == self.gid || acked.contains(&gid) {
                continue;
            }
            let how = if reply.timed_out.iter().any(|(g, _)| *g == gid) {
                format!("did not answer within {NOTIFY_TIMEOUT_MS} ms")
            } else {
                format!(
                    "lost its watch (silent for {} s: stopped, paused or cut off)",
                    self.watch_timeout_s
                )
            };
            tracing::warn!(
                object = %self.name,
                "gateway client.{gid} at {addr} {how}: blocklisting it (ceph osd blocklist add {addr})"
            );
            self.object
                .blocklist(&addr, std::time::Duration::from_millis(NOTIFY_TIMEOUT_MS))?;
            unpublish(&self.gateways, gid, &self.name);
        }
        Ok(())
    }

    /// A result of this client's: a blocklisting fences the client (its image's I/O too).
    fn noticing<T>(&self, r: std::io::Result<T>) -> std::io::Result<T> {
        if let Err(e) = &r {
            if e.raw_os_error() == Some(ESHUTDOWN) {
                self.object.mark_fenced();
            }
        }
        r
    }

    /// Hands a new state to the logical unit; whether to acknowledge it (false: a change that
    /// took access away while commands here did not end in time).
    fn deliver(&self, text: Option<&str>, version: u64) -> bool {
        let on_change = self
            .callbacks
            .on_change
            .read()
            .unwrap_or_else(|e| e.into_inner());
        match on_change.as_ref() {
            Some(f) => f(text, version),
            None => true,
        }
    }

    fn load(&self) -> std::io::Result<(Option<String>, u64)> {
        let (bytes, version) = self.noticing(self.object.read())?;
        let text = match bytes {
            Some(b) if !b.is_empty() => Some(String::from_utf8(b).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "state is not UTF-8")
            })?),
            _ => None,
        };
        Ok((text, version))
    }
}

impl Drop for Inner {
    /// A gateway that stops cleanly unpublishes itself: the next announcement does not fence
    /// an address nobody uses any more.
    fn drop(&mut self) {
        unpublish(&self.gateways, self.gid, &self.name);
    }
}

/// Removes what a gateway's client published in `lanes.gw.IMAGE`.
pub(crate) fn unpublish(gateways: &ObjectIo, gid: u64, name: &str) {
    for key in [
        format!("{CLIENT}{gid}"),
        format!("{PROCESS}{gid}"),
        format!("{ALUA}{gid}"),
    ] {
        match gateways.remove_xattr(&key) {
            // A blocklisted client cannot; whoever fenced it unpublished it.
            Err(e) if e.raw_os_error() == Some(ESHUTDOWN) => {}
            Err(e) => tracing::warn!(object = %name, "unpublishing {key}: {e}"),
            Ok(()) => {}
        }
    }
}

/// Fences the clients that gateway processes now gone from this machine left published (this
/// gateway's predecessor after a crash or a kill -9): their watches would otherwise hold every
/// reservation change and reset of the other gateways for the watch timeout. Best effort: what
/// fails here is left to that timeout.
fn fence_gone_predecessors(
    object: &ObjectIo,
    gateways: &ObjectIo,
    gid: u64,
    me: &Incarnation,
    name: &str,
) {
    let listed = match gateways.xattrs("") {
        Ok(listed) => listed,
        Err(e) => {
            tracing::warn!(object = %name, "reading the published gateways: {e}");
            return;
        }
    };
    let addr_of = |g: u64| {
        listed
            .iter()
            .find(|(key, _)| key.strip_prefix(CLIENT).and_then(|n| n.parse().ok()) == Some(g))
            .map(|(_, addr)| addr.clone())
    };
    for (key, text) in &listed {
        let Some(other) = key
            .strip_prefix(PROCESS)
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let Some(process) = Incarnation::parse(text) else {
            continue;
        };
        if other == gid || process.liveness(me) != Liveness::Gone {
            continue;
        }
        let Some(addr) = addr_of(other) else {
            // Unpublished already (fenced by another gateway); only its process entry is left.
            unpublish(gateways, other, name);
            continue;
        };
        tracing::warn!(
            object = %name,
            "gateway client.{other} at {addr} was published by process {} of this machine, which \
             is gone: blocklisting it now (ceph osd blocklist add {addr}) so that the other \
             gateways need not wait for its watch to time out",
            process.pid()
        );
        match object.blocklist(&addr, std::time::Duration::from_millis(NOTIFY_TIMEOUT_MS)) {
            Ok(()) => unpublish(gateways, other, name),
            Err(e) => tracing::warn!(object = %name, "blocklisting client.{other} at {addr}: {e}"),
        }
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
            (Some(Err(Error::Call { errno, .. })), _) if errno == ESHUTDOWN => {
                inner.object.mark_fenced();
                tracing::error!(
                    "not re-watching {}: the cluster has blocklisted this gateway's client \
                     (it reconnects with a new one)",
                    inner.name
                );
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
        self.inner().load()
    }

    fn store_if(&self, version: u64, text: &str) -> std::io::Result<StoreResult> {
        let inner = self.inner();
        Ok(
            match inner.noticing(inner.object.write_full_if(version, text.as_bytes()))? {
                Some(v) => StoreResult::Stored(v),
                None => StoreResult::Conflict,
            },
        )
    }

    fn announce(&self, version: u64, text: &str) -> std::io::Result<()> {
        self.inner()
            .tell_all(format!("{version}\n{text}").as_bytes())
    }

    fn subscribe(&self, on_change: PrChangeFn) {
        *self
            .shared
            .callbacks
            .on_change
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(on_change);
    }

    fn notify(&self, attention: &str) -> std::io::Result<()> {
        let inner = self.inner();
        let payload = format!("notice {}\n{attention}", inner.sender);
        inner.tell_all(payload.as_bytes())
    }

    fn drains_on_reset(&self) -> bool {
        true
    }

    /// Every gateway is a port group of its own (a tag of its own, as REPORT TARGET PORT
    /// GROUPS across gateways needs too), and relative target port ids are the tags: an I_T
    /// nexus is named alike on every gateway, so the SPC-2 RESERVE holder is shared like the
    /// persistent reservations are.
    fn shares_legacy(&self) -> bool {
        true
    }

    fn subscribe_notices(&self, on_notice: NoticeFn) {
        *self
            .shared
            .callbacks
            .on_notice
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(on_notice);
    }
}
