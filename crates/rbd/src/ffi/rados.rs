//! One RADOS object: read with its version, replace it if its version is still the one read
//! (compare-and-set), and watch/notify on it. Part of the `ffi` module: every call passes a
//! context this module created and keeps alive, an object name it NUL-terminated, and buffers
//! whose length it passes alongside.

use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use super::{api, check, cstring, symbol, Handle, Pool};
use crate::Error;

type ReadFn = unsafe extern "C" fn(Handle, *const c_char, *mut c_char, usize, u64) -> c_int;
type LastVersion = unsafe extern "C" fn(Handle) -> u64;
type CreateOp = unsafe extern "C" fn() -> Handle;
type ReleaseOp = unsafe extern "C" fn(Handle);
type AssertVersion = unsafe extern "C" fn(Handle, u64);
type OpCreate = unsafe extern "C" fn(Handle, c_int, *const c_char);
type OpWriteFull = unsafe extern "C" fn(Handle, *const c_char, usize);
type OpOperate = unsafe extern "C" fn(Handle, Handle, *const c_char, *mut i64, c_int) -> c_int;
type WatchCb = extern "C" fn(*mut c_void, u64, u64, u64, *mut c_void, usize);
type WatchErrCb = extern "C" fn(*mut c_void, u64, c_int);
type Watch2 = unsafe extern "C" fn(
    Handle,
    *const c_char,
    *mut u64,
    WatchCb,
    WatchErrCb,
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
type GetXattr =
    unsafe extern "C" fn(Handle, *const c_char, *const c_char, *mut c_char, usize) -> c_int;

/// The object calls of librados (resolved from the library [`api`] loaded).
struct ObjApi {
    read: ReadFn,
    last_version: LastVersion,
    create_op: CreateOp,
    release_op: ReleaseOp,
    assert_version: AssertVersion,
    op_create: OpCreate,
    op_write_full: OpWriteFull,
    op_operate: OpOperate,
    watch2: Watch2,
    unwatch2: Unwatch2,
    watch_flush: WatchFlush,
    notify_ack: NotifyAck,
    notify2: Notify2,
    buffer_free: BufferFree,
    mon_command: MonCommand,
    osd_command: OsdCommand,
    wait_for_latest_osdmap: WaitForLatestOsdmap,
    get_instance_id: GetInstanceId,
    getaddrs: GetAddrs,
    setxattr: SetXattr,
    getxattr: GetXattr,
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
                watch2: symbol(l, "rados_watch2", r)?,
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
                getxattr: symbol(l, "rados_getxattr", r)?,
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
const ETIMEDOUT: c_int = 110;
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
    api: &'static ObjApi,
    pool: Arc<Pool>,
    io: Mutex<Handle>,
    oid: CString,
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

    /// Extended attribute `name` of the object, None when it has none of that name.
    pub fn get_xattr(&self, name: &str) -> std::io::Result<Option<String>> {
        let io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        let name = CString::new(name).map_err(|_| std::io::Error::other("xattr name"))?;
        let mut buf = vec![0u8; 512];
        // SAFETY: live context; NUL-terminated names; the buffer is writable for its length.
        let n = unsafe {
            (self.api.getxattr)(
                *io,
                self.oid.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n == -ENOENT || n == -ENODATA {
            return Ok(None);
        }
        let n = usize::try_from(n).map_err(|_| os_error(n))?;
        buf.truncate(n);
        Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
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

/// Called with a notification's payload; the notification is acknowledged when it returns
/// true (a watcher that does not acknowledge makes the notifier's call time out).
pub type OnNotify = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;
/// Called with the (negative) error that broke a watch.
pub type OnError = Box<dyn Fn(i32) + Send + Sync>;

/// What a watch calls: with each notification's payload (the notification is acknowledged
/// when it returns), and with the error that broke the watch.
struct WatchCtx {
    api: &'static ObjApi,
    io: Handle,
    oid: CString,
    on_notify: OnNotify,
    on_error: OnError,
}

extern "C" fn watch_cb(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    _notifier: u64,
    data: *mut c_void,
    len: usize,
) {
    // SAFETY: `arg` is the WatchCtx given to rados_watch2; it is freed only after
    // rados_unwatch2 and rados_watch_flush, so it outlives every callback.
    let ctx = unsafe { &*(arg as *const WatchCtx) };
    let payload: &[u8] = if data.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: librados passes the payload and its length, valid during the callback.
        unsafe { std::slice::from_raw_parts(data as *const u8, len) }
    };
    // A panic must not unwind into librados: it is caught, and the notification acknowledged.
    let ack = catch_unwind(AssertUnwindSafe(|| (ctx.on_notify)(payload))).unwrap_or(true);
    if !ack {
        return;
    }
    // SAFETY: the watch's live context and NUL-terminated name; no reply payload.
    unsafe {
        (ctx.api.notify_ack)(
            ctx.io,
            ctx.oid.as_ptr(),
            notify_id,
            cookie,
            std::ptr::null(),
            0,
        );
    }
}

extern "C" fn watch_err_cb(arg: *mut c_void, _cookie: u64, err: c_int) {
    // SAFETY: as in `watch_cb`.
    let ctx = unsafe { &*(arg as *const WatchCtx) };
    let _ = catch_unwind(AssertUnwindSafe(|| (ctx.on_error)(err)));
}

/// A watch on an object, with its own I/O context; unwatched when dropped.
pub struct Watch {
    api: &'static ObjApi,
    pool: Arc<Pool>,
    ctx: *mut WatchCtx,
    cookie: Mutex<u64>,
}

// The context pointer is only read by librados callbacks and freed in Drop.
unsafe impl Send for Watch {}
unsafe impl Sync for Watch {}

impl Watch {
    pub fn new(obj: &ObjectIo, on_notify: OnNotify, on_error: OnError) -> Result<Watch, Error> {
        let io = obj.pool.new_ioctx()?;
        let ctx = Box::into_raw(Box::new(WatchCtx {
            api: obj.api,
            io,
            oid: obj.oid.clone(),
            on_notify,
            on_error,
        }));
        let watch = Watch {
            api: obj.api,
            pool: obj.pool.clone(),
            ctx,
            cookie: Mutex::new(0),
        };
        watch.rewatch()?;
        Ok(watch)
    }

    /// (Re-)establishes the watch, dropping the old one if any.
    pub fn rewatch(&self) -> Result<(), Error> {
        let mut cookie = self.cookie.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `ctx` lives until Drop, which needs `&mut self` (no call is running).
        let ctx = unsafe { &*self.ctx };
        if *cookie != 0 {
            // SAFETY: live context; a cookie rados_watch2 returned (an already broken watch
            // is an error that changes nothing).
            unsafe { (self.api.unwatch2)(ctx.io, *cookie) };
            *cookie = 0;
        }
        let mut new = 0u64;
        // SAFETY: live context; NUL-terminated name; valid out pointer; `ctx` stays alive
        // until after rados_unwatch2 and rados_watch_flush in Drop.
        let rc = unsafe {
            (self.api.watch2)(
                ctx.io,
                ctx.oid.as_ptr(),
                &mut new,
                watch_cb,
                watch_err_cb,
                self.ctx.cast(),
            )
        };
        check(rc, "rados_watch2", &ctx.oid.to_string_lossy())?;
        *cookie = new;
        Ok(())
    }

    /// Notifies every watcher (this one included) and waits for their acknowledgements, at
    /// most `timeout_ms`; returns the (gid, cookie) of the watchers that did not acknowledge
    /// in time (empty when all did).
    pub fn notify(&self, payload: &[u8], timeout_ms: u64) -> std::io::Result<Vec<(u64, u64)>> {
        // SAFETY: see `rewatch`.
        let ctx = unsafe { &*self.ctx };
        let len = c_int::try_from(payload.len())
            .map_err(|_| std::io::Error::other("notification too large"))?;
        let mut reply: *mut c_char = std::ptr::null_mut();
        let mut reply_len = 0usize;
        // SAFETY: live context; NUL-terminated name; the payload is readable for `len`;
        // valid out pointers; the reply buffer is freed below.
        let rc = unsafe {
            let rc = (self.api.notify2)(
                ctx.io,
                ctx.oid.as_ptr(),
                payload.as_ptr().cast(),
                len,
                timeout_ms,
                &mut reply,
                &mut reply_len,
            );
            let timeouts = if reply.is_null() {
                None
            } else {
                let r = std::slice::from_raw_parts(reply as *const u8, reply_len);
                let t = notify_timeouts(r);
                (self.api.buffer_free)(reply);
                t
            };
            (rc, timeouts)
        };
        let (rc, timeouts) = rc;
        match (rc, timeouts) {
            (0.., _) => Ok(Vec::new()),
            (rc, Some(t)) if rc == -ETIMEDOUT && !t.is_empty() => Ok(t),
            (rc, _) => Err(os_error(rc)),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let cookie = *self.cookie.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the watch is removed and every callback already queued has run (flush)
        // before the context is freed; the context was made by Box::into_raw in `new` and
        // is freed once, here, with its I/O context, before the pool (held by `pool`).
        unsafe {
            let io = (*self.ctx).io;
            if cookie != 0 {
                (self.api.unwatch2)(io, cookie);
            }
            (self.api.watch_flush)(self.pool.cluster);
            (self.pool.api.ioctx_destroy)(io);
            drop(Box::from_raw(self.ctx));
        }
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

/// The watchers that timed out, from a notify reply: `le32 acks, {le64 gid, le64 cookie, le32
/// len, len bytes} * acks, le32 timeouts, {le64 gid, le64 cookie} * timeouts`. None when the
/// reply does not parse.
pub fn notify_timeouts(reply: &[u8]) -> Option<Vec<(u64, u64)>> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = reply.get(at..at.checked_add(n)?)?;
        at += n;
        Some(s)
    };
    let u32_of = |b: &[u8]| b.try_into().ok().map(u32::from_le_bytes);
    let u64_of = |b: &[u8]| b.try_into().ok().map(u64::from_le_bytes);
    let acks = u32_of(take(4)?)?;
    for _ in 0..acks {
        take(16)?;
        let len = u32_of(take(4)?)? as usize;
        take(len)?;
    }
    let timeouts = u32_of(take(4)?)?;
    let mut out = Vec::new();
    for _ in 0..timeouts {
        let gid = u64_of(take(8)?)?;
        let cookie = u64_of(take(8)?)?;
        out.push((gid, cookie));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_replies_name_the_watchers_that_timed_out() {
        let mut r = Vec::new();
        r.extend_from_slice(&2u32.to_le_bytes());
        for (gid, cookie, payload) in [(4100u64, 1u64, &b"ok"[..]), (4101, 2, &b""[..])] {
            r.extend_from_slice(&gid.to_le_bytes());
            r.extend_from_slice(&cookie.to_le_bytes());
            r.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            r.extend_from_slice(payload);
        }
        r.extend_from_slice(&1u32.to_le_bytes());
        r.extend_from_slice(&4102u64.to_le_bytes());
        r.extend_from_slice(&93_000_000u64.to_le_bytes());
        assert_eq!(notify_timeouts(&r), Some(vec![(4102, 93_000_000)]));
        assert_eq!(notify_timeouts(&r[..r.len() - 1]), None, "truncated");
        assert_eq!(notify_timeouts(&[0, 0, 0, 0, 0, 0, 0, 0]), Some(vec![]));
        assert_eq!(notify_timeouts(&[]), None);
    }

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
