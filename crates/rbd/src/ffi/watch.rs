//! A watch on one RADOS object, and notifications to every watch on it: how the gateways of
//! an image tell each other of reservation changes and see each other alive. A watch is
//! registered with a short timeout (the LUN's `watch-timeout`) and the client pings it often
//! (`objecter_tick_interval`, set by the gateway's client options): an OSD drops the watch of
//! a gateway that stopped pinging (killed, paused, cut off) within that timeout, so a
//! notification never waits longer than that for a silent gateway. Part of the `ffi` module;
//! the symbols are resolved with the other object calls (`rados.rs`).

use std::ffi::{c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex};

use super::rados::{ObjApi, ObjectIo, ETIMEDOUT};
use super::{check, Handle, Pool};
use crate::Error;

/// The answer to a notification: who acknowledged it, and who was still watching when it
/// timed out (as (gid, cookie)). A watch the OSD dropped meanwhile is in neither list.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NotifyReply {
    pub acked: Vec<(u64, u64)>,
    pub timed_out: Vec<(u64, u64)>,
}

/// Called with a notification's payload; the notification is acknowledged when it returns
/// true (a watcher that does not acknowledge makes the notifier's call time out).
pub type OnNotify = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;
/// Called with the (negative) error that broke a watch.
pub type OnError = Box<dyn Fn(i32) + Send + Sync>;

/// What a watch's notifications need, shared by the watch and the thread that takes them:
/// the I/O context lives until both are done with it.
struct Shared {
    api: &'static ObjApi,
    /// Destroyed before the pool it belongs to (held here).
    pool: Arc<Pool>,
    io: Handle,
    oid: CString,
    on_notify: OnNotify,
}

// The I/O context is used for acknowledgements and watch calls, which librados allows from
// any thread; it is destroyed once, when the last holder drops.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: created for this watch in `Watch::new` and destroyed once, here, after the
        // watch was removed and its callbacks flushed (the context holds the last clone).
        unsafe { (self.pool.api.ioctx_destroy)(self.io) };
    }
}

/// One notification, taken by the watch's thread.
struct Notification {
    id: u64,
    cookie: u64,
    payload: Vec<u8>,
}

/// What librados calls back with: notifications are queued for the watch's own thread, which
/// runs `on_notify` and acknowledges. They are not taken on librados' thread: that thread
/// also completes the client's I/O, and a notification that waits for the commands under
/// way here (a reset elsewhere) would wait for itself until it gave up.
struct WatchCtx {
    shared: Arc<Shared>,
    queue: mpsc::Sender<Notification>,
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
    // SAFETY: `arg` is the WatchCtx given to rados_watch3; it is freed only after
    // rados_unwatch2 and rados_watch_flush, so it outlives every callback.
    let ctx = unsafe { &*(arg as *const WatchCtx) };
    let payload = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: librados passes the payload and its length, valid during the callback.
        unsafe { std::slice::from_raw_parts(data as *const u8, len) }.to_vec()
    };
    let _ = ctx.queue.send(Notification {
        id: notify_id,
        cookie,
        payload,
    });
}

/// The watch's thread: takes each notification in order and acknowledges it when
/// `on_notify` says so (a watcher that does not acknowledge makes the notifier's call time
/// out). Ends when the watch is dropped.
fn take_notifications(shared: Arc<Shared>, queue: mpsc::Receiver<Notification>) {
    for n in queue {
        // A panic is caught, and the notification acknowledged.
        let ack = catch_unwind(AssertUnwindSafe(|| (shared.on_notify)(&n.payload))).unwrap_or(true);
        if ack {
            // SAFETY: the live I/O context (held by `shared`) and NUL-terminated name; no
            // reply payload.
            unsafe {
                (shared.api.notify_ack)(
                    shared.io,
                    shared.oid.as_ptr(),
                    n.id,
                    n.cookie,
                    std::ptr::null(),
                    0,
                );
            }
        }
    }
}

extern "C" fn watch_err_cb(arg: *mut c_void, _cookie: u64, err: c_int) {
    // SAFETY: as in `watch_cb`.
    let ctx = unsafe { &*(arg as *const WatchCtx) };
    let _ = catch_unwind(AssertUnwindSafe(|| (ctx.on_error)(err)));
}

/// A watch on an object, with its own I/O context and a thread that takes its notifications;
/// unwatched when dropped.
pub struct Watch {
    api: &'static ObjApi,
    pool: Arc<Pool>,
    ctx: *mut WatchCtx,
    cookie: Mutex<u64>,
    taker: Option<std::thread::JoinHandle<()>>,
    /// Seconds after which an OSD drops this watch once its client stops pinging it. The
    /// gateways' clients ping every half second (`objecter_tick_interval` in the client
    /// options), and a dead one holds up a notification for at most this long.
    timeout_s: u32,
}

// The context pointer is only read by librados callbacks and freed in Drop.
unsafe impl Send for Watch {}
unsafe impl Sync for Watch {}

impl Watch {
    pub fn new(
        obj: &ObjectIo,
        timeout_s: u32,
        on_notify: OnNotify,
        on_error: OnError,
    ) -> Result<Watch, Error> {
        let io = obj.pool.new_ioctx()?;
        let shared = Arc::new(Shared {
            api: obj.api,
            pool: obj.pool.clone(),
            io,
            oid: obj.oid.clone(),
            on_notify,
        });
        let (queue, taken) = mpsc::channel();
        let taker = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("lanes-watch".into())
                .spawn(move || take_notifications(shared, taken))
                .map_err(|e| Error::Invalid(format!("starting the watch's thread: {e}")))?
        };
        let ctx = Box::into_raw(Box::new(WatchCtx {
            shared,
            queue,
            on_error,
        }));
        let watch = Watch {
            api: obj.api,
            pool: obj.pool.clone(),
            ctx,
            cookie: Mutex::new(0),
            taker: Some(taker),
            timeout_s,
        };
        watch.rewatch()?;
        Ok(watch)
    }

    /// (Re-)establishes the watch, dropping the old one if any.
    pub fn rewatch(&self) -> Result<(), Error> {
        let mut cookie = self.cookie.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `ctx` lives until Drop, which needs `&mut self` (no call is running).
        let ctx = unsafe { &*self.ctx };
        let io = ctx.shared.io;
        if *cookie != 0 {
            // SAFETY: live context; a cookie rados_watch3 returned (an already broken watch
            // is an error that changes nothing).
            unsafe { (self.api.unwatch2)(io, *cookie) };
            *cookie = 0;
        }
        let mut new = 0u64;
        // SAFETY: live context; NUL-terminated name; valid out pointer; `ctx` stays alive
        // until after rados_unwatch2 and rados_watch_flush in Drop.
        let rc = unsafe {
            (self.api.watch3)(
                io,
                ctx.shared.oid.as_ptr(),
                &mut new,
                watch_cb,
                watch_err_cb,
                self.timeout_s,
                self.ctx.cast(),
            )
        };
        check(rc, "rados_watch3", &ctx.shared.oid.to_string_lossy())?;
        *cookie = new;
        Ok(())
    }

    /// Notifies every watcher (this one included) and waits for their acknowledgements, at
    /// most `timeout_ms` (less when a silent watcher's watch times out first: it is then
    /// dropped from the notification).
    pub fn notify(&self, payload: &[u8], timeout_ms: u64) -> std::io::Result<NotifyReply> {
        // SAFETY: see `rewatch`.
        let ctx = unsafe { &*self.ctx };
        let len = c_int::try_from(payload.len())
            .map_err(|_| std::io::Error::other("notification too large"))?;
        let mut reply: *mut std::ffi::c_char = std::ptr::null_mut();
        let mut reply_len = 0usize;
        // SAFETY: live context; NUL-terminated name; the payload is readable for `len`;
        // valid out pointers; the reply buffer is freed below.
        let (rc, parsed) = unsafe {
            let rc = (self.api.notify2)(
                ctx.shared.io,
                ctx.shared.oid.as_ptr(),
                payload.as_ptr().cast(),
                len,
                timeout_ms,
                &mut reply,
                &mut reply_len,
            );
            let parsed = if reply.is_null() {
                None
            } else {
                let r = std::slice::from_raw_parts(reply as *const u8, reply_len);
                let p = notify_reply(r);
                (self.api.buffer_free)(reply);
                p
            };
            (rc, parsed)
        };
        match (rc, parsed) {
            (0.., Some(p)) => Ok(p),
            (rc, Some(p)) if rc == -ETIMEDOUT => Ok(p),
            (0.., None) => Err(std::io::Error::other("a notify reply that does not parse")),
            (rc, _) => Err(std::io::Error::from_raw_os_error(-rc)),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let cookie = *self.cookie.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the watch is removed and every callback already queued has run (flush)
        // before the context is freed; the context was made by Box::into_raw in `new` and
        // is freed once, here. Its I/O context goes with the last holder of `Shared` (this
        // context or the thread taking notifications), before the pool.
        unsafe {
            if cookie != 0 {
                let ctx = &*self.ctx;
                (self.api.unwatch2)(ctx.shared.io, cookie);
            }
            (self.api.watch_flush)(self.pool.cluster);
            drop(Box::from_raw(self.ctx));
        }
        // The queue is closed: the thread ends once it has taken what was queued. When the
        // last owner of the watch let go on that very thread, it ends by itself.
        if let Some(taker) = self.taker.take() {
            if taker.thread().id() != std::thread::current().id() {
                let _ = taker.join();
            }
        }
    }
}

/// A notify reply: `le32 acks, {le64 gid, le64 cookie, le32 len, len bytes} * acks, le32
/// timeouts, {le64 gid, le64 cookie} * timeouts`. None when it does not parse.
pub fn notify_reply(reply: &[u8]) -> Option<NotifyReply> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = reply.get(at..at.checked_add(n)?)?;
        at += n;
        Some(s)
    };
    let u32_of = |b: &[u8]| b.try_into().ok().map(u32::from_le_bytes);
    let u64_of = |b: &[u8]| b.try_into().ok().map(u64::from_le_bytes);
    let mut out = NotifyReply::default();
    let acks = u32_of(take(4)?)?;
    for _ in 0..acks {
        let gid = u64_of(take(8)?)?;
        let cookie = u64_of(take(8)?)?;
        let len = u32_of(take(4)?)? as usize;
        take(len)?;
        out.acked.push((gid, cookie));
    }
    let timeouts = u32_of(take(4)?)?;
    for _ in 0..timeouts {
        let gid = u64_of(take(8)?)?;
        let cookie = u64_of(take(8)?)?;
        out.timed_out.push((gid, cookie));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_replies_name_who_acknowledged_and_who_timed_out() {
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
        assert_eq!(
            notify_reply(&r),
            Some(NotifyReply {
                acked: vec![(4100, 1), (4101, 2)],
                timed_out: vec![(4102, 93_000_000)],
            })
        );
        assert_eq!(notify_reply(&r[..r.len() - 1]), None, "truncated");
        assert_eq!(
            notify_reply(&[0, 0, 0, 0, 0, 0, 0, 0]),
            Some(NotifyReply::default())
        );
        assert_eq!(notify_reply(&[]), None);
    }
}
