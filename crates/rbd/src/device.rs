//! [`RbdDevice`]: a block device over one RBD image.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use blockstore::{AioCompletion, AsyncBlockIo, BlockDevice, Extent, ReadDone};
use bytes::{Bytes, BytesMut};

use crate::ffi::{Image, OnError, Pool};
use crate::Error;

/// Where an image is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSource {
    pub pool: String,
    pub image: String,
    /// The cluster's configuration file (monitors, keyring).
    pub ceph_conf: PathBuf,
    /// The client name without `client.` (default `admin`).
    pub client: String,
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

/// What every gateway's client must run with: no client-side cache (another gateway's write
/// must be visible at once, and an acknowledged write must be on the OSDs), and discards that
/// zero partial objects so deallocated ranges read back zeros.
/// A gateway's client: no cache (every gateway reads what any other wrote), and its watches
/// pinged every half second, so that a live gateway keeps its watch within
/// [`crate::ffi::WATCH_TIMEOUT_S`] and a silent one loses it (`pr_store.rs`).
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
    image: Image,
    size: AtomicU64,
    id: String,
    /// The cluster refused this client (`ceph osd blocklist`): every I/O fails at once as
    /// NotConnected (NOT READY, TARGET PORT IN UNAVAILABLE STATE for the hosts) until lanes
    /// serve is restarted with a new client.
    fenced: Arc<AtomicBool>,
    /// [`noticing_blocklisting`] for asynchronous requests (shared, not built per request).
    on_error: OnError,
    /// librbd has `rbd_aio_*`: READs and WRITEs wait on no thread.
    aio: bool,
}

/// The clients of the images opened in this process, by image, for the image's reservation
/// store: a gateway is then one RADOS client per image, so fencing it (`ceph osd blocklist`
/// of that client) stops its data and its reservation watch alike.
static CLIENTS: std::sync::Mutex<Vec<(String, std::sync::Weak<Pool>)>> =
    std::sync::Mutex::new(Vec::new());

fn client_key(source: &RbdSource) -> String {
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
             hosts are sent to other paths; restart lanes serve to reconnect"
        );
    }
    fenced_error()
}

impl RbdDevice {
    /// Connects and opens the image; refuses one with exclusive-lock.
    pub fn open(source: &RbdSource) -> Result<RbdDevice, Error> {
        let conf = source.ceph_conf.display().to_string();
        let pool = Arc::new(Pool::connect(
            &conf,
            &source.client,
            &CLIENT_OPTIONS,
            &source.pool,
        )?);
        register_client(source, &pool);
        // The client's flag: a blocklisting the reservation store notices fences I/O too.
        let fenced = pool.fenced().clone();
        let image = Image::open(pool, &source.image)?;
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
        Ok(RbdDevice {
            image,
            size: AtomicU64::new(size),
            id,
            fenced,
            on_error,
            aio: crate::ffi::aio_available(),
        })
    }

    /// Refuses I/O once fenced.
    fn gate(&self) -> std::io::Result<()> {
        if self.fenced.load(Ordering::Acquire) {
            Err(fenced_error())
        } else {
            Ok(())
        }
    }

    /// Notices a blocklisting in a librbd result: the device is fenced from then on.
    fn watch<T>(&self, r: std::io::Result<T>) -> std::io::Result<T> {
        r.map_err(|e| noticing_blocklisting(&self.fenced, &self.id, e))
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
        self.gate()?;
        let mut done = 0;
        while done < buf.len() {
            let rest = buf.get_mut(done..).unwrap_or_default();
            let n = self.watch(self.image.read(rest, offset + done as u64))?;
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
        self.gate()?;
        let mut done = 0;
        while done < buf.len() {
            let n = self.watch(
                self.image
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
        self.gate()?;
        self.watch(self.image.flush())
    }

    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.check(offset, len)?;
        self.gate()?;
        self.watch(self.image.discard(offset, len))
    }

    fn fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    fn aio(&self) -> Option<&dyn AsyncBlockIo> {
        self.aio.then_some(self as &dyn AsyncBlockIo)
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
            self.image
                .size_now()
                .map_err(|e| std::io::Error::other(e.to_string())),
        )
    }

    fn grow(&self, size: u64) -> std::io::Result<()> {
        let now = self
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
        if let Err(e) = self
            .check(offset, write.len() as u64)
            .and_then(|()| self.gate())
        {
            return Some(Err(e));
        }
        // librbd reports the first difference relative to the request, as SCSI does.
        let done = self.watch(self.image.compare_and_write(compare, write, offset));
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

/// `rbd_aio_*`: librbd's own threads complete each request; no thread of ours waits.
impl AsyncBlockIo for RbdDevice {
    fn read(&self, buf: BytesMut, offset: u64, done: AioCompletion<ReadDone>) {
        if let Err(e) = self
            .check(offset, buf.len() as u64)
            .and_then(|()| self.gate())
        {
            return done.complete((Err(e), buf));
        }
        // Ranges inside the image always read in full (unwritten ones as zeros).
        self.image
            .aio_read(buf, offset, done, self.on_error.clone());
    }

    fn write(&self, data: Vec<Bytes>, offset: u64, done: AioCompletion<std::io::Result<()>>) {
        let len = data.iter().map(|b| b.len() as u64).sum();
        if let Err(e) = self.check(offset, len).and_then(|()| self.gate()) {
            return done.complete(Err(e));
        }
        if len == 0 {
            // librbd refuses an empty vector; there is nothing to write.
            return done.complete(Ok(()));
        }
        self.image
            .aio_write(data, offset, done, self.on_error.clone());
    }

    fn flush(&self, done: AioCompletion<std::io::Result<()>>) {
        if let Err(e) = self.gate() {
            return done.complete(Err(e));
        }
        self.image.aio_flush(done, self.on_error.clone());
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
        };
        let err = RbdDevice::open(&source).err().expect("no cluster here");
        let text = err.to_string();
        assert!(
            text.contains("librados") || text.contains("/nonexistent/ceph.conf"),
            "{text}"
        );
    }
}
