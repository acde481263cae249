//! One RADOS object: read with its version, replace it if its version is still the one read
//! (compare-and-set), its extended attributes, and commands to the monitors and OSDs (the
//! blocklist); the symbols of the watch calls (`watch.rs`) are resolved here too. Part of the `ffi` module: every call passes a
//! context this module created and keeps alive, an object name it NUL-terminated, and buffers
//! whose length it passes alongside.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

use super::{api, cstring, symbol, Handle, Pool};
use crate::Error;

type ReadFn = unsafe extern "C" fn(Handle, *const c_char, *mut c_char, usize, u64) -> c_int;
type LastVersion = unsafe extern "C" fn(Handle) -> u64;
type CreateOp = unsafe extern "C" fn() -> Handle;
type ReleaseOp = unsafe extern "C" fn(Handle);
type AssertVersion = unsafe extern "C" fn(Handle, u64);
type OpCreate = unsafe extern "C" fn(Handle, c_int, *const c_char);
type OpWriteFull = unsafe extern "C" fn(Handle, *const c_char, usize);
type OpOperate = unsafe extern "C" fn(Handle, Handle, *const c_char, *mut i64, c_int) -> c_int;
pub(super) type WatchCb = extern "C" fn(*mut c_void, u64, u64, u64, *mut c_void, usize);
pub(super) type WatchErrCb = extern "C" fn(*mut c_void, u64, c_int);
type Watch3 = unsafe extern "C" fn(
    Handle,
    *const c_char,
    *mut u64,
    WatchCb,
    WatchErrCb,
    u32,
    *mut c_void,
) -> c_int;
type Unwatch2 = unsafe extern "C" fn(Handle, u64) -> c_int;
type WatchFlush = unsafe extern "C" fn(Handle) -> c_int;
type NotifyAck =
    unsafe extern "C" fn(Handle, *const c_char, u64, u64, *const c_char, c_int) -> c_int;
type Notify2 = unsafe extern "C" fn(
    Handle,
    *const c_char,
    *const c_char,
    c_int,
    u64,
    *mut *mut c_char,
    *mut usize,
) -> c_int;
type BufferFree = unsafe extern "C" fn(*mut c_char);
type MonCommand = unsafe extern "C" fn(
    Handle,
    *mut *const c_char,
    usize,
    *const c_char,
    usize,
    *mut *mut c_char,
    *mut usize,
    *mut *mut c_char,
    *mut usize,
) -> c_int;

type OsdCommand = unsafe extern "C" fn(
    Handle,
    c_int,
    *mut *const c_char,
    usize,
    *const c_char,
    usize,
    *mut *mut c_char,
    *mut usize,
    *mut *mut c_char,
    *mut usize,
) -> c_int;
type WaitForLatestOsdmap = unsafe extern "C" fn(Handle) -> c_int;
type GetInstanceId = unsafe extern "C" fn(Handle) -> u64;
type GetAddrs = unsafe extern "C" fn(Handle, *mut *mut c_char) -> c_int;
type SetXattr =
    unsafe extern "C" fn(Handle, *const c_char, *const c_char, *const c_char, usize) -> c_int;
type GetXattrs = unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> c_int;
type GetXattrsNext =
    unsafe extern "C" fn(Handle, *mut *const c_char, *mut *const c_char, *mut usize) -> c_int;
type GetXattrsEnd = unsafe extern "C" fn(Handle);
type RmXattr = unsafe extern "C" fn(Handle, *const c_char, *const c_char) -> c_int;

/// The object calls of librados (resolved from the library [`api`] loaded).
pub(super) struct ObjApi {
    read: ReadFn,
    last_version: LastVersion,
    create_op: CreateOp,
    release_op: ReleaseOp,
    assert_version: AssertVersion,
    op_create: OpCreate,
    op_write_full: OpWriteFull,
    op_operate: OpOperate,
    pub(super) watch3: Watch3,
    pub(super) unwatch2: Unwatch2,
    pub(super) watch_flush: WatchFlush,
    pub(super) notify_ack: NotifyAck,
    pub(super) notify2: Notify2,
    pub(super) buffer_free: BufferFree,
    mon_command: MonCommand,
    osd_command: OsdCommand,
    wait_for_latest_osdmap: WaitForLatestOsdmap,
    get_instance_id: GetInstanceId,
    getaddrs: GetAddrs,
    setxattr: SetXattr,
    getxattrs: GetXattrs,
    getxattrs_next: GetXattrsNext,
    getxattrs_end: GetXattrsEnd,
    rmxattr: RmXattr,
}

// Plain C functions, callable from any thread; the library is never unloaded.
unsafe impl Send for ObjApi {}
unsafe impl Sync for ObjApi {}

static OBJ_API: OnceLock<Result<ObjApi, String>> = OnceLock::new();

fn obj_api() -> Result<&'static ObjApi, Error> {
    let base = api()?;
    let loaded = OBJ_API.get_or_init(|| {
        let l = &base._rados;
        let r = "librados.so.2";
        (|| -> Result<ObjApi, Error> {
            Ok(ObjApi {
                read: symbol(l, "rados_read", r)?,
                last_version: symbol(l, "rados_get_last_version", r)?,
                create_op: symbol(l, "rados_create_write_op", r)?,
                release_op: symbol(l, "rados_release_write_op", r)?,
                assert_version: symbol(l, "rados_write_op_assert_version", r)?,
                op_create: symbol(l, "rados_write_op_create", r)?,
                op_write_full: symbol(l, "rados_write_op_write_full", r)?,
                op_operate: symbol(l, "rados_write_op_operate", r)?,
                watch3: symbol(l, "rados_watch3", r)?,
                unwatch2: symbol(l, "rados_unwatch2", r)?,
                watch_flush: symbol(l, "rados_watch_flush", r)?,
                notify_ack: symbol(l, "rados_notify_ack", r)?,
                notify2: symbol(l, "rados_notify2", r)?,
                buffer_free: symbol(l, "rados_buffer_free", r)?,
                mon_command: symbol(l, "rados_mon_command", r)?,
                osd_command: symbol(l, "rados_osd_command", r)?,
                wait_for_latest_osdmap: symbol(l, "rados_wait_for_latest_osdmap", r)?,
                get_instance_id: symbol(l, "rados_get_instance_id", r)?,
                getaddrs: symbol(l, "rados_getaddrs", r)?,
                setxattr: symbol(l, "rados_setxattr", r)?,
                getxattrs: symbol(l, "rados_getxattrs", r)?,
                getxattrs_next: symbol(l, "rados_getxattrs_next", r)?,
                getxattrs_end: symbol(l, "rados_getxattrs_end", r)?,
                rmxattr: symbol(l, "rados_rmxattr", r)?,
            })
        })()
        .map_err(|e| e.to_string())
    });
    loaded.as_ref().map_err(|reason| Error::Load {
        library: "librados".into(),
        reason: reason.clone(),
    })
}

const ENOENT: c_int = 2;
pub(super) const ETIMEDOUT: c_int = 110;
const ENODATA: c_int = 61;
const EEXIST: c_int = 17;
const ERANGE: c_int = 34;
const EOVERFLOW: c_int = 75;
/// The largest object this reads (reservation state is a few KiB).
const MAX_OBJECT: usize = 16 << 20;

fn os_error(rc: c_int) -> std::io::Error {
    std::io::Error::from_raw_os_error(-rc)
}

/// One object of a pool, with its own I/O context (whose "last version" only this value's
/// calls, serialised by `io`, touch).
pub struct ObjectIo {
    pub(super) api: &'static ObjApi,
    pub(super) pool: Arc<Pool>,
    io: Mutex<Handle>,
    pub(super) oid: CString,
}

// The context is used under the mutex; librados contexts may move between threads.
unsafe impl Send for ObjectIo {}
unsafe impl Sync for ObjectIo {}

impl ObjectIo {
    pub fn open(pool: Arc<Pool>, oid: &str) -> Result<ObjectIo, Error> {
        let api = obj_api()?;
        let io = pool.new_ioctx()?;
        Ok(ObjectIo {
            api,
            pool,
            io: Mutex::new(io),
            oid: cstring(oid, "object name")?,
        })
    }

    /// The object's bytes and version; a missing object is `None` and version 0.
    pub fn read(&self) -> std::io::Result<(Option<Vec<u8>>, u64)> {
        let io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        let mut len = 64 << 10;
        loop {
            let mut buf = vec![0u8; len];
            // SAFETY: live context (held by the lock); NUL-terminated name; the buffer is
            // writable for `len` bytes.
            let n =
                unsafe { (self.api.read)(*io, self.oid.as_ptr(), buf.as_mut_ptr().cast(), len, 0) };
            if n == -ENOENT {
                return Ok((None, 0));
            }
            let n = usize::try_from(n).map_err(|_| os_error(n))?;
            if n == len && len < MAX_OBJECT {
                len *= 2;
                continue;
            }
            buf.truncate(n);
            // SAFETY: live context; the version is that of the read just made (the lock keeps
            // other calls off this context).
            let version = unsafe { (self.api.last_version)(*io) };
            return Ok((Some(buf), version));
        }
    }

    /// Replaces the object's bytes if its version is still `version` (0: if it does not
    /// exist); `Ok(None)` when it is not, else the new version.
    pub fn write_full_if(&self, version: u64, data: &[u8]) -> std::io::Result<Option<u64>> {
        let io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: no arguments; the op is released below on every path.
        let op = unsafe { (self.api.create_op)() };
        if op.is_null() {
            return Err(std::io::Error::other("rados_create_write_op failed"));
        }
        // SAFETY: `op` is the live op created above; `data` is readable for its length and
        // outlives the operate call (librados copies it into the op); the context is live
        // (held by the lock); the name is NUL-terminated; a null mtime means now.
        let rc = unsafe {
            if version == 0 {
                (self.api.op_create)(op, 1, std::ptr::null());
            } else {
                (self.api.assert_version)(op, version);
            }
            (self.api.op_write_full)(op, data.as_ptr().cast(), data.len());
            let rc = (self.api.op_operate)(op, *io, self.oid.as_ptr(), std::ptr::null_mut(), 0);
            (self.api.release_op)(op);
            rc
        };
        match rc {
            0.. => {
                // SAFETY: live context; the version of the write just made.
                Ok(Some(unsafe { (self.api.last_version)(*io) }))
            }
            rc if [-ERANGE, -EOVERFLOW, -EEXIST, -ENOENT].contains(&rc) => Ok(None),
            rc => Err(os_error(rc)),
        }
    }

    /// Records that the cluster refused this object's client as blocklisted.
    pub fn mark_fenced(&self) {
        if !self
            .pool
            .fenced()
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            tracing::error!(
                object = %self.oid.to_string_lossy(),
                "the Ceph cluster has blocklisted this gateway's client: I/O refused, hosts \
                 are sent to other paths until a new client reconnects"
            );
        }
    }

    /// Creates the object empty unless it exists (a watch needs it).
    pub fn create(&self) -> std::io::Result<()> {
        self.write_full_if(0, b"").map(|_| ())
    }

    /// This client's global id (`client.N`, as notify replies name watchers) and address
    /// (`IP:PORT/NONCE`, as `ceph osd blocklist add` takes it).
    pub fn client_identity(&self) -> std::io::Result<(u64, String)> {
        let mut addrs: *mut c_char = std::ptr::null_mut();
        // SAFETY: the cluster handle lives as long as `pool`; a valid out pointer whose
        // buffer is freed below.
        let (gid, rc, text) = unsafe {
            let gid = (self.api.get_instance_id)(self.pool.cluster);
            let rc = (self.api.getaddrs)(self.pool.cluster, &mut addrs);
            let text = if addrs.is_null() {
                String::new()
            } else {
                let t = std::ffi::CStr::from_ptr(addrs)
                    .to_string_lossy()
                    .into_owned();
                (self.api.buffer_free)(addrs);
                t
            };
            (gid, rc, text)
        };
        if rc < 0 {
            return Err(os_error(rc));
        }
        Ok((gid, client_addr(&text)))
    }

    /// Sets extended attribute `name` of the object to `value`.
    pub fn set_xattr(&self, name: &str, value: &str) -> std::io::Result<()> {
        let io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        let name = CString::new(name).map_err(|_| std::io::Error::other("xattr name"))?;
        // SAFETY: live context; NUL-terminated names; the value is readable for its length.
        let rc = unsafe {
            (self.api.setxattr)(
                *io,
                self.oid.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
            )
        };
        if rc < 0 {
            Err(os_error(rc))
        } else {
            Ok(())
        }
    }

    /// Every extended attribute of the object whose name starts with `prefix`, with its value.
    pub fn xattrs(&self, prefix: &str) -> std::io::Result<Vec<(String, String)>> {
        let io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        let mut iter: Handle = std::ptr::null_mut();
        // SAFETY: live context; NUL-terminated name; valid out pointer; the iterator is ended
        // below on every path once created.
        let rc = unsafe { (self.api.getxattrs)(*io, self.oid.as_ptr(), &mut iter) };
        if rc < 0 {
            return Err(os_error(rc));
        }
        let mut out = Vec::new();
        let result = loop {
            let (mut name, mut value, mut len) = (std::ptr::null(), std::ptr::null(), 0usize);
            // SAFETY: the live iterator; valid out pointers; librados owns the strings, valid
            // until the next call on the iterator (copied before it).
            let rc = unsafe { (self.api.getxattrs_next)(iter, &mut name, &mut value, &mut len) };
            if rc < 0 {
                break Err(os_error(rc));
            }
            if name.is_null() {
                break Ok(());
            }
            // SAFETY: as above: a NUL-terminated name and `len` bytes of value.
            let (name, value) = unsafe {
                let n = std::ffi::CStr::from_ptr(name)
                    .to_string_lossy()
                    .into_owned();
                let v = if value.is_null() {
                    String::new()
                } else {
                    let b = std::slice::from_raw_parts(value as *const u8, len);
                    String::from_utf8_lossy(b).into_owned()
                };
                (n, v)
            };
            if name.starts_with(prefix) {
                out.push((name, value));
            }
        };
        // SAFETY: the iterator created above, ended once.
        unsafe { (self.api.getxattrs_end)(iter) };
        result.map(|()| out)
    }

    /// Removes extended attribute `name` (none of that name is not an error).
    pub fn remove_xattr(&self, name: &str) -> std::io::Result<()> {
        let io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        let name = CString::new(name).map_err(|_| std::io::Error::other("xattr name"))?;
        // SAFETY: live context; NUL-terminated names.
        let rc = unsafe { (self.api.rmxattr)(*io, self.oid.as_ptr(), name.as_ptr()) };
        match rc {
            0.. => Ok(()),
            rc if rc == -ENOENT || rc == -ENODATA => Ok(()),
            rc => Err(os_error(rc)),
        }
    }

    /// `ceph osd blocklist add ADDR` through the monitors; then this client takes the OSD
    /// map that holds it (so its own next I/O makes each placement group it reaches catch up
    /// first), and waits (at most `wait`) until every OSD that is up has that map: from then
    /// on the OSDs refuse the blocklisted client, so what it still has in flight does not
    /// land.
    pub fn blocklist(&self, addr: &str, wait: std::time::Duration) -> std::io::Result<()> {
        let deadline = std::time::Instant::now() + wait;
        self.command(
            None,
            &format!(
                "{{\"prefix\": \"osd blocklist\", \"blocklistop\": \"add\", \"addr\": \"{addr}\"}}"
            ),
        )?;
        // SAFETY: the cluster handle lives as long as `pool`.
        let rc = unsafe { (self.api.wait_for_latest_osdmap)(self.pool.cluster) };
        if rc < 0 {
            return Err(os_error(rc));
        }
        let dump = self.command(None, "{\"prefix\": \"osd dump\", \"format\": \"json\"}")?;
        let epoch = json_number(&dump, "epoch")
            .ok_or_else(|| std::io::Error::other("osd dump without an epoch"))?;
        for osd in up_osds(&dump) {
            loop {
                let status = self.command(Some(osd), "{\"prefix\": \"status\"}");
                match status
                    .as_deref()
                    .ok()
                    .and_then(|t| json_number(t, "newest_map"))
                {
                    Some(n) if n >= epoch => break,
                    _ if std::time::Instant::now() >= deadline => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("osd.{osd} has not reached OSD map {epoch} (the blocklist of {addr})"),
                        ));
                    }
                    _ => std::thread::sleep(std::time::Duration::from_millis(20)),
                }
            }
        }
        Ok(())
    }

    /// A monitor command (`osd` None) or a command to `osd.N`; its output text.
    fn command(&self, osd: Option<c_int>, json: &str) -> std::io::Result<String> {
        let cmd = CString::new(json).map_err(|_| std::io::Error::other("command with NUL"))?;
        let mut cmds = [cmd.as_ptr()];
        let (mut out, mut out_len) = (std::ptr::null_mut::<c_char>(), 0usize);
        let (mut status, mut status_len) = (std::ptr::null_mut::<c_char>(), 0usize);
        // SAFETY: the cluster handle lives as long as `pool`; one NUL-terminated command; no
        // input; valid out pointers, whose buffers are freed below.
        let (rc, out_text, status_text) = unsafe {
            let rc = match osd {
                None => (self.api.mon_command)(
                    self.pool.cluster,
                    cmds.as_mut_ptr(),
                    1,
                    std::ptr::null(),
                    0,
                    &mut out,
                    &mut out_len,
                    &mut status,
                    &mut status_len,
                ),
                Some(id) => (self.api.osd_command)(
                    self.pool.cluster,
                    id,
                    cmds.as_mut_ptr(),
                    1,
                    std::ptr::null(),
                    0,
                    &mut out,
                    &mut out_len,
                    &mut status,
                    &mut status_len,
                ),
            };
            let text = |p: *mut c_char, len: usize| {
                if p.is_null() || len == 0 {
                    String::new()
                } else {
                    let s = std::slice::from_raw_parts(p as *const u8, len);
                    String::from_utf8_lossy(s).into_owned()
                }
            };
            let (o, st) = (text(out, out_len), text(status, status_len));
            if !out.is_null() {
                (self.api.buffer_free)(out);
            }
            if !status.is_null() {
                (self.api.buffer_free)(status);
            }
            (rc, o, st)
        };
        if rc < 0 {
            Err(std::io::Error::new(
                os_error(rc).kind(),
                format!("{json}: {} ({status_text})", os_error(rc)),
            ))
        } else {
            Ok(out_text)
        }
    }
}

impl Drop for ObjectIo {
    fn drop(&mut self) {
        let io = self.io.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: created by this value, destroyed once, before its pool (held by `pool`).
        unsafe { (self.pool.api.ioctx_destroy)(*io) };
    }
}

/// The number after `"KEY":` in JSON text (the first one).
fn json_number(json: &str, key: &str) -> Option<u64> {
    let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = json.get(at..)?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The ids of the OSDs that are up in `osd dump --format json` (`"osd":N,...,"up":1`).
fn up_osds(dump: &str) -> Vec<c_int> {
    let Some(start) = dump.find("\"osds\":[") else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    let mut rest = dump.get(start..).unwrap_or_default();
    while let Some(at) = rest.find("{\"osd\":") {
        rest = rest.get(at + 7..).unwrap_or_default();
        let id = json_number(&format!("\"osd\":{rest}"), "osd");
        let up = rest
            .find("\"up\":")
            .and_then(|u| rest.get(u + 5..u + 6))
            .is_some_and(|v| v == "1");
        if let (Some(id), true) = (id.and_then(|i| c_int::try_from(i).ok()), up) {
            ids.push(id);
        }
    }
    ids
}

/// One address out of `rados_getaddrs`' text (`[v2:IP:PORT/NONCE,v1:...]`, `any:...` or a
/// bare `IP:PORT/NONCE`), without its type, as `ceph osd blocklist add` takes it.
pub fn client_addr(text: &str) -> String {
    let first = text
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .next()
        .unwrap_or_default();
    first
        .strip_prefix("v2:")
        .or_else(|| first.strip_prefix("v1:"))
        .or_else(|| first.strip_prefix("any:"))
        .unwrap_or(first)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn osd_dumps_give_the_epoch_and_the_osds_up() {
        let dump = r#"{"epoch":42,"fsid":"x","osds":[{"osd":0,"uuid":"a","up":1,"in":1},{"osd":1,"uuid":"b","up":0,"in":1},{"osd":2,"uuid":"c","up":1,"in":0}],"osd_xinfo":[]}"#;
        assert_eq!(json_number(dump, "epoch"), Some(42));
        assert_eq!(up_osds(dump), vec![0, 2]);
        assert_eq!(json_number(r#"{"newest_map": 57}"#, "newest_map"), Some(57));
        assert_eq!(json_number("{}", "epoch"), None);
    }

    #[test]
    fn client_addresses_lose_their_type() {
        assert_eq!(client_addr("127.0.0.1:0/3912"), "127.0.0.1:0/3912");
        assert_eq!(client_addr("any:127.0.0.1:0/3912"), "127.0.0.1:0/3912");
        assert_eq!(
            client_addr("[v2:10.0.0.5:0/77,v1:10.0.0.5:0/77]"),
            "10.0.0.5:0/77"
        );
    }
}
