//! [`RbdDevice`]: a block device over one RBD image.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use blockstore::{AsyncBlockIo, BlockDevice, Extent};

use crate::ffi::{Image, OnError, Pool};
use crate::port_groups::SharedGroups;
use crate::Error;

mod aio;

/// Where an image is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSource {
    pub pool: String,
    pub image: String,
    /// The cluster's configuration file (monitors, keyring).
    pub ceph_conf: PathBuf,
    /// The client name without `client.` (default `admin`).
    pub client: String,
    /// Seconds after which the OSDs drop the reservation watch of a gateway that stopped
    /// pinging (killed, paused, cut off), so that the others may fence it
    /// ([`DEFAULT_WATCH_TIMEOUT_S`], within [`WATCH_TIMEOUT_RANGE`]).
    pub watch_timeout_s: u32,
}

/// The default watch timeout: a live gateway pings every half second, so it keeps its watch
/// through nine missed pings in a row (a busy machine); Ceph's own default is 30 s.
pub const DEFAULT_WATCH_TIMEOUT_S: u32 = 5;
/// Watch timeouts a LUN may set: at least four pings' worth, at most twice Ceph's default.
pub const WATCH_TIMEOUT_RANGE: std::ops::RangeInclusive<u32> = 2..=60;

/// A watch timeout as a configuration writes it (`"5"`), or what is wrong with it.
pub fn parse_watch_timeout(value: &str) -> Result<u32, String> {
    value
        .trim()
        .parse()
        .ok()
        .filter(|s| WATCH_TIMEOUT_RANGE.contains(s))
        .ok_or_else(|| {
            format!(
                "must be whole seconds from {} to {}, got {value}",
                WATCH_TIMEOUT_RANGE.start(),
                WATCH_TIMEOUT_RANGE.end()
            )
        })
}

impl RbdSource {
    /// `POOL/IMAGE`, as `rbd` writes it.
    pub fn spec(&self) -> String {
        format!("{}/{}", self.pool, self.image)
    }
}

/// RBD feature bits (librbd.h).
const EXCLUSIVE_LOCK: u64 = 1 << 2;
const OBJECT_MAP: u64 = 1 << 3;
const FAST_DIFF: u64 = 1 << 4;
const JOURNALING: u64 = 1 << 6;

/// A gateway's client: no cache (another gateway's write must be visible at once, and an
/// acknowledged write must be on the OSDs), discards that zero partial objects (deallocated
/// ranges read back zeros), and its watches pinged every half second, so that a live gateway
/// keeps its watch within [`RbdSource::watch_timeout_s`] and a silent one loses it
/// (`pr_store.rs`).
pub(crate) const CLIENT_OPTIONS: [(&str, &str); 3] = [
    ("rbd_cache", "false"),
    ("rbd_skip_partial_discard", "false"),
    ("objecter_tick_interval", "0.5"),
];

/// The features to disable (in the order `rbd feature disable` needs) for `features`.
fn blocking_features(features: u64) -> Vec<&'static str> {
    [
        (JOURNALING, "journaling"),
        (FAST_DIFF, "fast-diff"),
        (OBJECT_MAP, "object-map"),
        (EXCLUSIVE_LOCK, "exclusive-lock"),
    ]
    .into_iter()
    .filter(|(bit, _)| features & bit != 0)
    .map(|(_, name)| name)
    .collect()
}

pub struct RbdDevice {
    /// The client and the image open on it; replaced whole by [`BlockDevice::reconnect`].
    conn: ArcSwap<Conn>,
    source: RbdSource,
    size: AtomicU64,
    id: String,
    /// librbd has `rbd_aio_*`: READs and WRITEs wait on no thread.
    aio: bool,
}

/// One client of the cluster with the image open on it.
struct Conn {
    image: Image,
    /// The cluster refused this client (`ceph osd blocklist`): every I/O fails at once as
    /// NotConnected (NOT READY, TARGET PORT IN UNAVAILABLE STATE for the hosts) until a new
    /// client replaces it. The client's own flag (its reservation store sets it too).
    fenced: Arc<AtomicBool>,
    /// [`noticing_blocklisting`] for asynchronous requests (shared, not built per request).
    on_error: OnError,
    /// This client's entry for port groups in `lanes.gw.IMAGE`.
    groups: SharedGroups,
}

impl Conn {
    /// A new client with the image open; refuses an image with exclusive-lock. Returns the
    /// client too (the reservation store moves to it) and the image's size and id.
    fn open(source: &RbdSource) -> Result<(Conn, Arc<Pool>, u64, String), Error> {
        let conf = source.ceph_conf.display().to_string();
        let pool = Arc::new(Pool::connect(
            &conf,
            &source.client,
            &CLIENT_OPTIONS,
            &source.pool,
        )?);
        let fenced = pool.fenced().clone();
        let image = Image::open(pool.clone(), &source.image)?;
        let features = image.features()?;
        if features & EXCLUSIVE_LOCK != 0 {
            return Err(Error::ExclusiveLock {
                image: source.spec(),
                features: blocking_features(features).join(" "),
            });
        }
        let size = image.size()?;
        let id = image.id()?;
        let on_error: OnError = {
            let (fenced, id) = (fenced.clone(), id.clone());
            Arc::new(move |e| noticing_blocklisting(&fenced, &id, e))
        };
        let groups = SharedGroups::open(pool.clone(), &source.image)?;
        let conn = Conn {
            image,
            fenced,
            on_error,
            groups,
        };
        Ok((conn, pool, size, id))
    }
}

/// The clients of the images opened in this process, by image, for the image's reservation
/// store: a gateway is then one RADOS client per image, so fencing it (`ceph osd blocklist`
/// of that client) stops its data and its reservation watch alike.
static CLIENTS: std::sync::Mutex<Vec<(String, std::sync::Weak<Pool>)>> =
    std::sync::Mutex::new(Vec::new());

pub(crate) fn client_key(source: &RbdSource) -> String {
    format!(
        "{}\n{}\n{}",
        source.ceph_conf.display(),
        source.client,
        source.spec()
    )
}

fn register_client(source: &RbdSource, pool: &Arc<Pool>) {
    let mut clients = CLIENTS.lock().unwrap_or_else(|e| e.into_inner());
    clients.retain(|(_, p)| p.strong_count() > 0);
    let key = client_key(source);
    clients.retain(|(k, _)| *k != key);
    clients.push((key, Arc::downgrade(pool)));
}

/// The client of the device open on `source` in this process, if any.
pub(crate) fn client_of(source: &RbdSource) -> Option<Arc<Pool>> {
    let key = client_key(source);
    let clients = CLIENTS.lock().unwrap_or_else(|e| e.into_inner());
    clients
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, p)| p.upgrade())
}

/// ESHUTDOWN: what librados answers a blocklisted client.
const EBLOCKLISTED: i32 = 108;

fn fenced_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "this gateway's Ceph client is blocklisted",
    )
}

/// A librbd error as the device reports it: a blocklisting fences the device (logged once)
/// and becomes NotConnected; any other error is returned as it is.
fn noticing_blocklisting(fenced: &AtomicBool, id: &str, e: std::io::Error) -> std::io::Error {
    if e.raw_os_error() != Some(EBLOCKLISTED) {
        return e;
    }
    if !fenced.swap(true, Ordering::AcqRel) {
        tracing::error!(
            image = %id,
            "the Ceph cluster has blocklisted this gateway's client: I/O refused, \
             hosts are sent to other paths until a new client reconnects"
        );
    }
    fenced_error()
}

impl RbdDevice {
    /// Connects and opens the image; refuses one with exclusive-lock.
    pub fn open(source: &RbdSource) -> Result<RbdDevice, Error> {
        let (conn, pool, size, id) = Conn::open(source)?;
        register_client(source, &pool);
        Ok(RbdDevice {
            conn: ArcSwap::from_pointee(conn),
            source: source.clone(),
            size: AtomicU64::new(size),
            id,
            aio: crate::ffi::aio_available(),
        })
    }

    /// The current client, or NotConnected once it is fenced.
    fn gate(&self) -> std::io::Result<arc_swap::Guard<Arc<Conn>>> {
        let conn = self.conn.load();
        if conn.fenced.load(Ordering::Acquire) {
            Err(fenced_error())
        } else {
            Ok(conn)
        }
    }

    /// Notices a blocklisting in a librbd result of `conn`: its client is fenced from then on.
    fn watch<T>(&self, conn: &Conn, r: std::io::Result<T>) -> std::io::Result<T> {
        r.map_err(|e| noticing_blocklisting(&conn.fenced, &self.id, e))
    }

    /// The image's id, stable across renames.
    pub fn image_id(&self) -> &str {
        &self.id
    }

    fn check(&self, offset: u64, len: u64) -> std::io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size.load(Ordering::Acquire) => Ok(()),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "range beyond end of image",
            )),
        }
    }
}

impl BlockDevice for RbdDevice {
    fn size_bytes(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        let conn = self.gate()?;
        let mut done = 0;
        while done < buf.len() {
            let rest = buf.get_mut(done..).unwrap_or_default();
            let n = self.watch(&conn, conn.image.read(rest, offset + done as u64))?;
            if n == 0 {
                // Past the end of what the image holds: zeros.
                rest.fill(0);
                break;
            }
            done += n;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        let conn = self.gate()?;
        let mut done = 0;
        while done < buf.len() {
            let n = self.watch(
                &conn,
                conn.image
                    .write(buf.get(done..).unwrap_or_default(), offset + done as u64),
            )?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    "librbd wrote nothing",
                ));
            }
            done += n;
        }
        Ok(())
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        match bufs {
            [one] => self.write_at(one, offset),
            _ => {
                // One librbd write, so the range is one request to the OSDs.
                let joined = bufs.concat();
                self.write_at(&joined, offset)
            }
        }
    }

    fn flush(&self) -> std::io::Result<()> {
        let conn = self.gate()?;
        self.watch(&conn, conn.image.flush())
    }

    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.check(offset, len)?;
        let conn = self.gate()?;
        self.watch(&conn, conn.image.discard(offset, len))
    }

    fn fenced(&self) -> bool {
        self.conn.load().fenced.load(Ordering::Acquire)
    }

    /// A new client (the blocklist names the old one), the same image (by id) open on it, and
    /// the reservation store moved to it (watching, its state reloaded, published) before the
    /// device lets I/O through again.
    fn reconnect(&self) -> std::io::Result<bool> {
        if !self.fenced() {
            return Ok(true);
        }
        let (conn, pool, _, id) = Conn::open(&self.source).map_err(std::io::Error::other)?;
        if id != self.id {
            return Err(std::io::Error::other(format!(
                "{} is another image now (id {id}, was {}): not reconnecting",
                self.source.spec(),
                self.id
            )));
        }
        register_client(&self.source, &pool);
        crate::pr_store::move_to_client(&self.source, &pool).map_err(std::io::Error::other)?;
        // Whoever fenced the old client normally unpublished it; a blocklisting from outside
        // lanes (`ceph osd blocklist add`) did not.
        let old = self.conn.load().groups.gid();
        if let Ok(gateways) = crate::ffi::ObjectIo::open(
            pool.clone(),
            &crate::pr_store::gateways_object_name(&self.source.image),
        ) {
            crate::pr_store::unpublish(&gateways, old, &self.source.spec());
        }
        self.conn.store(Arc::new(conn));
        tracing::warn!(
            image = %self.id,
            "reconnected to the Ceph cluster with a new client: serving again"
        );
        Ok(true)
    }

    fn aio(&self) -> Option<&dyn AsyncBlockIo> {
        self.aio.then_some(self as &dyn AsyncBlockIo)
    }

    fn write_same(&self, offset: u64, len: u64, pattern: &[u8]) -> Option<std::io::Result<()>> {
        Some(self.check(offset, len).and_then(|()| {
            let conn = self.gate()?;
            self.watch(&conn, conn.image.write_same(offset, len, pattern))
        }))
    }

    fn share_port_groups(&self, mine: &[(u16, u8)]) -> Option<std::io::Result<Vec<(u16, u8)>>> {
        Some(
            self.gate()
                .and_then(|conn| self.watch(&conn, conn.groups.share(mine))),
        )
    }

    fn allocation_map(&self, offset: u64, len: u64) -> std::io::Result<Vec<Extent>> {
        // Without object-map librbd cannot tell cheaply: report the range as data.
        self.check(offset, len)?;
        Ok(if len == 0 {
            Vec::new()
        } else {
            vec![Extent {
                offset,
                len,
                allocated: true,
            }]
        })
    }

    fn size_from_storage(&self) -> Option<std::io::Result<u64>> {
        Some(
            self.conn
                .load()
                .image
                .size_now()
                .map_err(|e| std::io::Error::other(e.to_string())),
        )
    }

    fn grow(&self, size: u64) -> std::io::Result<()> {
        let now = self
            .conn
            .load()
            .image
            .size_now()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if now < size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                format!("the image holds {now} bytes; resize it with `rbd resize` first"),
            ));
        }
        self.size.store(now, Ordering::Release);
        Ok(())
    }

    fn holes_read_zero(&self) -> bool {
        true
    }

    /// No client-side cache: every write waits for the OSDs.
    fn writes_stay_local(&self) -> bool {
        false
    }

    fn compare_and_write_max(&self) -> Option<u64> {
        // librbd (16.2) refuses a compare-and-write that leaves one 512-byte sector (EINVAL).
        Some(512)
    }

    fn compare_and_write(
        &self,
        compare: &[u8],
        write: &[u8],
        offset: u64,
    ) -> Option<std::io::Result<Option<u64>>> {
        let conn = match self
            .check(offset, write.len() as u64)
            .and_then(|()| self.gate())
        {
            Ok(conn) => conn,
            Err(e) => return Some(Err(e)),
        };
        // librbd reports the first difference relative to the request, as SCSI does.
        let done = self.watch(&conn, conn.image.compare_and_write(compare, write, offset));
        if let Err(e) = &done {
            tracing::warn!(
                offset,
                len = write.len(),
                "COMPARE AND WRITE through librbd failed: {e}"
            );
        }
        Some(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_features_to_disable_come_in_the_order_rbd_needs() {
        let default = 1 | EXCLUSIVE_LOCK | OBJECT_MAP | FAST_DIFF | (1 << 5);
        assert_eq!(
            blocking_features(default),
            ["fast-diff", "object-map", "exclusive-lock"]
        );
        assert!(blocking_features(1).is_empty());
    }

    #[test]
    fn a_machine_without_librbd_gets_a_clear_error_not_a_crash() {
        // Either the library loads (Debian's librbd1 installed) or the error names it.
        let source = RbdSource {
            pool: "rbd".into(),
            image: "none".into(),
            ceph_conf: "/nonexistent/ceph.conf".into(),
            client: "admin".into(),
            watch_timeout_s: DEFAULT_WATCH_TIMEOUT_S,
        };
        let err = RbdDevice::open(&source).err().expect("no cluster here");
        let text = err.to_string();
        assert!(
            text.contains("librados") || text.contains("/nonexistent/ceph.conf"),
            "{text}"
        );
    }
}
