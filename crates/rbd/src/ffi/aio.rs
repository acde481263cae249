//! librbd's asynchronous I/O (`rbd_aio_read`, `rbd_aio_writev`, `rbd_aio_flush`,
//! `rbd_aio_discard`, `rbd_aio_writesame`, `rbd_aio_compare_and_write`): a request is submitted with a completion whose callback librbd runs on one of its own threads when
//! the OSDs have answered. Part of the `ffi` module.
//!
//! Ownership: each request's buffers live in a heap context ([`Request`]) handed to librbd as
//! the callback argument; the callback takes it back, so a buffer is freed only after librbd
//! is done with it, whatever happened to whoever awaited the result.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use blockstore::{AioCompletion, ReadDone};
use bytes::{Bytes, BytesMut};

use super::{api, symbol, Handle, Image};
use crate::Error;

type Callback = extern "C" fn(Handle, *mut c_void);
type CreateCompletion = unsafe extern "C" fn(*mut c_void, Callback, *mut Handle) -> c_int;
type AioRead = unsafe extern "C" fn(Handle, u64, usize, *mut c_char, Handle) -> c_int;
type AioWritev = unsafe extern "C" fn(Handle, *const IoVec, c_int, u64, Handle) -> c_int;
type AioFlush = unsafe extern "C" fn(Handle, Handle) -> c_int;
type AioDiscard = unsafe extern "C" fn(Handle, u64, u64, Handle) -> c_int;
type AioWriteSame =
    unsafe extern "C" fn(Handle, u64, usize, *const c_char, usize, Handle, c_int) -> c_int;
type AioCompareAndWrite = unsafe extern "C" fn(
    Handle,
    u64,
    usize,
    *const c_char,
    *const c_char,
    Handle,
    *mut u64,
    c_int,
) -> isize;
type GetReturnValue = unsafe extern "C" fn(Handle) -> isize;
type Release = unsafe extern "C" fn(Handle);

/// `struct iovec` (sys/uio.h).
#[repr(C)]
struct IoVec {
    base: *const c_void,
    len: usize,
}

struct AioApi {
    create_completion: CreateCompletion,
    read: AioRead,
    writev: AioWritev,
    flush: AioFlush,
    discard: AioDiscard,
    write_same: AioWriteSame,
    compare_and_write: AioCompareAndWrite,
    get_return_value: GetReturnValue,
    release: Release,
}

// Plain C functions, callable from any thread; the library is never unloaded.
unsafe impl Send for AioApi {}
unsafe impl Sync for AioApi {}

static AIO_API: OnceLock<Result<AioApi, String>> = OnceLock::new();

fn aio_api() -> Result<&'static AioApi, Error> {
    let base = api()?;
    let loaded = AIO_API.get_or_init(|| {
        let (l, b) = (&base._rbd, "librbd.so.1");
        (|| -> Result<AioApi, Error> {
            Ok(AioApi {
                create_completion: symbol(l, "rbd_aio_create_completion", b)?,
                read: symbol(l, "rbd_aio_read", b)?,
                writev: symbol(l, "rbd_aio_writev", b)?,
                flush: symbol(l, "rbd_aio_flush", b)?,
                discard: symbol(l, "rbd_aio_discard", b)?,
                write_same: symbol(l, "rbd_aio_writesame", b)?,
                compare_and_write: symbol(l, "rbd_aio_compare_and_write", b)?,
                get_return_value: symbol(l, "rbd_aio_get_return_value", b)?,
                release: symbol(l, "rbd_aio_release", b)?,
            })
        })()
        .map_err(|e| e.to_string())
    });
    loaded.as_ref().map_err(|reason| Error::Load {
        library: "librbd (aio)".into(),
        reason: reason.clone(),
    })
}

/// Whether this librbd has the asynchronous calls (resolves them once).
pub fn available() -> bool {
    aio_api().is_ok()
}

/// What a request holds until librbd completes it, and whom to tell.
enum Op {
    Read {
        buf: BytesMut,
        /// Bytes asked for, read into `buf`'s spare capacity.
        len: usize,
        done: AioCompletion<ReadDone>,
    },
    Write {
        _data: Vec<Bytes>,
        _iov: Vec<IoVec>,
        done: AioCompletion<std::io::Result<()>>,
    },
    Flush {
        done: AioCompletion<std::io::Result<()>>,
    },
    /// A discard or a write-same (`_pattern` is what librbd repeats).
    Other {
        _pattern: Option<Bytes>,
        done: AioCompletion<std::io::Result<()>>,
    },
    CompareAndWrite {
        _compare: Bytes,
        _write: Bytes,
        /// Where librbd puts the offset of the first difference (boxed: its address is handed
        /// to librbd before the request moves).
        mismatch: Box<u64>,
        offset: u64,
        len: usize,
        done: AioCompletion<std::io::Result<Option<u64>>>,
    },
}

/// librbd's answer to a compare-and-write whose compare differed.
const EILSEQ: isize = 84;

// The raw pointers in `_iov` point into `_data`, which the request owns and keeps alive.
unsafe impl Send for Op {}

/// Sees every failed result before the caller does, and may replace it (the device turns a
/// blocklisting into its fenced state there).
pub type OnError = std::sync::Arc<dyn Fn(std::io::Error) -> std::io::Error + Send + Sync>;

struct Request {
    api: &'static AioApi,
    op: Op,
    on_error: OnError,
}

impl Request {
    /// Ends the request with librbd's return value (bytes or a negative errno).
    fn finish(self, ret: isize) {
        if let Op::CompareAndWrite {
            mismatch,
            offset,
            len,
            done,
            ..
        } = self.op
        {
            let result = match ret {
                r if r >= 0 => Ok(None),
                r if r == -EILSEQ => Ok(Some(super::mismatch_in_request(*mismatch, offset, len))),
                r => Err((self.on_error)(std::io::Error::from_raw_os_error(
                    (-r) as i32,
                ))),
            };
            return done.complete(result);
        }
        let mut op = self.op;
        let result = if ret < 0 {
            Err((self.on_error)(std::io::Error::from_raw_os_error(
                (-ret) as i32,
            )))
        } else {
            if let Op::Read { buf, len, .. } = &mut op {
                let got = ret.unsigned_abs().min(*len);
                // SAFETY: librbd wrote `got` bytes (its return value, at most the `len` asked
                // for) at the start of the spare capacity that `aio_read` reserved for `len`.
                unsafe { buf.set_len(buf.len() + got) };
                // A short read (none inside the image) reads as zeros, as beyond its end.
                buf.resize(buf.len() + (*len - got), 0);
            }
            Ok(())
        };
        finish_op(op, result);
    }
}

fn finish_op(op: Op, result: std::io::Result<()>) {
    match op {
        Op::Read { buf, done, .. } => done.complete((result, buf)),
        Op::Write { done, .. } | Op::Flush { done } | Op::Other { done, .. } => {
            done.complete(result)
        }
        Op::CompareAndWrite { done, .. } => done.complete(result.map(|()| None)),
    }
}

extern "C" fn on_complete(completion: Handle, arg: *mut c_void) {
    // SAFETY: `arg` is the Box<Request> leaked by `submit` for this completion, taken back
    // exactly once: librbd calls this once per completion.
    let request = unsafe { Box::from_raw(arg as *mut Request) };
    let api = request.api;
    // SAFETY: the completion is live until released here, after its value is read.
    let ret = unsafe { (api.get_return_value)(completion) };
    // SAFETY: as above; released once, and not used afterwards.
    unsafe { (api.release)(completion) };
    // A panic must not unwind into librbd.
    let _ = catch_unwind(AssertUnwindSafe(|| request.finish(ret)));
}

impl Image {
    /// Hands `op` to librbd through `call` (given the completion). `call` uses only raw
    /// pointers taken from `op` before it moved into the request: once submitted, the request
    /// belongs to the callback, which may run before `call` returns.
    fn submit(&self, op: Op, on_error: OnError, call: impl FnOnce(&AioApi, Handle) -> c_int) {
        let api = match aio_api() {
            Ok(a) => a,
            Err(e) => return finish_op(op, Err(std::io::Error::other(e.to_string()))),
        };
        let raw = Box::into_raw(Box::new(Request { api, op, on_error }));
        let mut completion: Handle = std::ptr::null_mut();
        // SAFETY: valid out pointer; `raw` stays valid until the callback takes it back.
        let rc = unsafe { (api.create_completion)(raw.cast(), on_complete, &mut completion) };
        if rc < 0 {
            // SAFETY: no completion exists, so nothing else has `raw`: taken back once.
            let request = unsafe { Box::from_raw(raw) };
            let e = (request.on_error)(std::io::Error::from_raw_os_error(-rc));
            return finish_op(request.op, Err(e));
        }
        let rc = call(api, completion);
        if rc < 0 {
            // Not submitted: librbd will not call back; the completion is ours to release.
            // SAFETY: created above, never submitted, released once.
            unsafe { (api.release)(completion) };
            // SAFETY: the callback will never run, so `raw` is still ours: taken back once.
            let request = unsafe { Box::from_raw(raw) };
            let e = (request.on_error)(std::io::Error::from_raw_os_error(-rc));
            finish_op(request.op, Err(e));
        }
    }

    /// Appends the `len` bytes at `offset` to `buf`, read by librbd straight into its spare
    /// capacity (nothing zeroed first); `done` gets the result and the buffer back.
    pub fn aio_read(
        &self,
        mut buf: BytesMut,
        len: usize,
        offset: u64,
        done: AioCompletion<ReadDone>,
        on_error: OnError,
    ) {
        let image = self.image;
        buf.reserve(len);
        // The buffer's storage does not move when the BytesMut moves into the request.
        let ptr = buf.spare_capacity_mut().as_mut_ptr();
        // SAFETY: open image; the buffer lives in the request until the callback, and its
        // spare capacity (reserved above, at least `len` bytes) is writable and unused by
        // anything else until then.
        self.submit(Op::Read { buf, len, done }, on_error, |api, c| unsafe {
            (api.read)(image, offset, len, ptr.cast(), c)
        });
    }

    /// Writes the concatenation of `data` at `offset`.
    pub fn aio_write(
        &self,
        data: Vec<Bytes>,
        offset: u64,
        done: AioCompletion<std::io::Result<()>>,
        on_error: OnError,
    ) {
        let iov: Vec<IoVec> = data
            .iter()
            .map(|b| IoVec {
                base: b.as_ptr().cast(),
                len: b.len(),
            })
            .collect();
        let image = self.image;
        let (ptr, count) = (iov.as_ptr(), c_int::try_from(iov.len()).unwrap_or(-1));
        let op = Op::Write {
            _data: data,
            _iov: iov,
            done,
        };
        self.submit(op, on_error, |api, c| {
            if count < 0 {
                return -22;
            }
            // SAFETY: open image; the vectors and the bytes they point to live in the
            // request until the callback (moving a Vec or Bytes does not move its storage).
            unsafe { (api.writev)(image, ptr, count, offset, c) }
        });
    }

    /// Flushes (every write completed before it is durable).
    pub fn aio_flush(&self, done: AioCompletion<std::io::Result<()>>, on_error: OnError) {
        let image = self.image;
        // SAFETY: open image.
        self.submit(Op::Flush { done }, on_error, |api, c| unsafe {
            (api.flush)(image, c)
        });
    }

    /// Deallocates `len` bytes at `offset` (partial objects zeroed, as the image is opened
    /// with `rbd_skip_partial_discard` off).
    pub fn aio_discard(
        &self,
        offset: u64,
        len: u64,
        done: AioCompletion<std::io::Result<()>>,
        on_error: OnError,
    ) {
        let image = self.image;
        let op = Op::Other {
            _pattern: None,
            done,
        };
        // SAFETY: open image.
        self.submit(op, on_error, |api, c| unsafe {
            (api.discard)(image, offset, len, c)
        });
    }

    /// `pattern` repeated over `len` bytes from `offset`, sent to the OSDs once.
    pub fn aio_write_same(
        &self,
        pattern: Bytes,
        offset: u64,
        len: u64,
        done: AioCompletion<std::io::Result<()>>,
        on_error: OnError,
    ) {
        let image = self.image;
        let whole = usize::try_from(len)
            .ok()
            .filter(|l| !pattern.is_empty() && l.is_multiple_of(pattern.len()));
        let Some(len) = whole else {
            return done.complete(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "write same: the length is not a whole number of patterns",
            )));
        };
        let (ptr, plen) = (pattern.as_ptr(), pattern.len());
        let op = Op::Other {
            _pattern: Some(pattern),
            done,
        };
        // SAFETY: open image; the pattern lives in the request until the callback.
        self.submit(op, on_error, |api, c| unsafe {
            (api.write_same)(image, offset, len, ptr.cast(), plen, c, 0)
        });
    }

    /// Writes `write` at `offset` only if the range equals `compare` (atomically at the
    /// OSD); `done` gets the offset of the first difference when it did not.
    pub fn aio_compare_and_write(
        &self,
        compare: Bytes,
        write: Bytes,
        offset: u64,
        done: AioCompletion<std::io::Result<Option<u64>>>,
        on_error: OnError,
    ) {
        if compare.len() != write.len() {
            return done.complete(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "compare and write buffers differ in length",
            )));
        }
        let image = self.image;
        let (cmp, buf, len) = (compare.as_ptr(), write.as_ptr(), write.len());
        let mut mismatch = Box::new(0u64);
        let at: *mut u64 = &mut *mismatch;
        let op = Op::CompareAndWrite {
            _compare: compare,
            _write: write,
            mismatch,
            offset,
            len,
            done,
        };
        // SAFETY: open image; both buffers and the mismatch slot live in the request until
        // the callback (moving a Box or Bytes does not move what it points to).
        self.submit(op, on_error, |api, c| unsafe {
            let rc = (api.compare_and_write)(image, offset, len, cmp.cast(), buf.cast(), c, at, 0);
            c_int::try_from(rc).unwrap_or(-22)
        });
    }
}
