//! The handful of librados/librbd C functions lanes calls, resolved from the shared libraries
//! at run time. This is the only module with `unsafe`: each call passes handles that this
//! crate created and keeps alive ([`crate::device`] owns them), NUL-terminated strings it
//! built, and buffers whose length it passes alongside.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, OnceLock};

use libloading::Library;

use crate::{errno_text, Error};

mod aio;
mod rados;
mod watch;
pub use aio::{available as aio_available, OnError};
pub use rados::ObjectIo;
pub use watch::Watch;

pub type Handle = *mut c_void;

type Create = unsafe extern "C" fn(*mut Handle, *const c_char) -> c_int;
type ConfReadFile = unsafe extern "C" fn(Handle, *const c_char) -> c_int;
type ConfSet = unsafe extern "C" fn(Handle, *const c_char, *const c_char) -> c_int;
type Connect = unsafe extern "C" fn(Handle) -> c_int;
type Shutdown = unsafe extern "C" fn(Handle);
type IoctxCreate = unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> c_int;
type IoctxDestroy = unsafe extern "C" fn(Handle);
type Open = unsafe extern "C" fn(Handle, *const c_char, *mut Handle, *const c_char) -> c_int;
type Close = unsafe extern "C" fn(Handle) -> c_int;
type GetU64 = unsafe extern "C" fn(Handle, *mut u64) -> c_int;
type Read = unsafe extern "C" fn(Handle, u64, usize, *mut c_char) -> isize;
type Write = unsafe extern "C" fn(Handle, u64, usize, *const c_char) -> isize;
type Discard = unsafe extern "C" fn(Handle, u64, u64) -> c_int;
/// `rbd_writesame(image, ofs, len, buf, data_len, op_flags)`.
type WriteSame = unsafe extern "C" fn(Handle, u64, usize, *const c_char, usize, c_int) -> isize;
type Flush = unsafe extern "C" fn(Handle) -> c_int;
type GetId = unsafe extern "C" fn(Handle, *mut c_char, usize) -> c_int;
type CompareAndWrite = unsafe extern "C" fn(
    Handle,
    u64,
    usize,
    *const c_char,
    *const c_char,
    *mut u64,
    c_int,
) -> isize;

/// The resolved functions (the libraries stay loaded for the life of the process).
pub struct Api {
    _rados: Library,
    _rbd: Library,
    create: Create,
    conf_read_file: ConfReadFile,
    conf_set: ConfSet,
    connect: Connect,
    shutdown: Shutdown,
    ioctx_create: IoctxCreate,
    ioctx_destroy: IoctxDestroy,
    open: Open,
    close: Close,
    get_size: GetU64,
    get_features: GetU64,
    read: Read,
    write: Write,
    discard: Discard,
    write_same: WriteSame,
    flush: Flush,
    get_id: GetId,
    compare_and_write: CompareAndWrite,
}

// The function pointers are plain C functions that librados/librbd document as callable from
// any thread; the libraries are never unloaded.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

fn load(name: &str) -> Result<Library, Error> {
    // SAFETY: loading Ceph's client libraries runs their initialisers, which only register
    // their own state.
    unsafe { Library::new(name) }.map_err(|e| Error::Load {
        library: name.to_string(),
        reason: e.to_string(),
    })
}

fn symbol<T: Copy>(lib: &Library, name: &str, library: &str) -> Result<T, Error> {
    // SAFETY: `T` is the C signature of `name` as declared in librados.h / librbd.h.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| Error::Load {
            library: format!("{library} ({name})"),
            reason: e.to_string(),
        })
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// The loaded API, loading it on first use.
pub fn api() -> Result<&'static Api, Error> {
    let loaded = API.get_or_init(|| {
        (|| -> Result<Api, Error> {
            let rados = load("librados.so.2")?;
            let rbd = load("librbd.so.1")?;
            let (r, b) = ("librados.so.2", "librbd.so.1");
            Ok(Api {
                create: symbol(&rados, "rados_create", r)?,
                conf_read_file: symbol(&rados, "rados_conf_read_file", r)?,
                conf_set: symbol(&rados, "rados_conf_set", r)?,
                connect: symbol(&rados, "rados_connect", r)?,
                shutdown: symbol(&rados, "rados_shutdown", r)?,
                ioctx_create: symbol(&rados, "rados_ioctx_create", r)?,
                ioctx_destroy: symbol(&rados, "rados_ioctx_destroy", r)?,
                open: symbol(&rbd, "rbd_open", b)?,
                close: symbol(&rbd, "rbd_close", b)?,
                get_size: symbol(&rbd, "rbd_get_size", b)?,
                get_features: symbol(&rbd, "rbd_get_features", b)?,
                read: symbol(&rbd, "rbd_read", b)?,
                write: symbol(&rbd, "rbd_write", b)?,
                discard: symbol(&rbd, "rbd_discard", b)?,
                write_same: symbol(&rbd, "rbd_writesame", b)?,
                flush: symbol(&rbd, "rbd_flush", b)?,
                get_id: symbol(&rbd, "rbd_get_id", b)?,
                compare_and_write: symbol(&rbd, "rbd_compare_and_write", b)?,
                _rados: rados,
                _rbd: rbd,
            })
        })()
        .map_err(|e| e.to_string())
    });
    loaded.as_ref().map_err(|reason| Error::Load {
        library: "librados/librbd".into(),
        reason: reason.clone(),
    })
}

fn cstring(text: &str, what: &str) -> Result<CString, Error> {
    CString::new(text).map_err(|_| Error::Invalid(format!("{what} {text:?} contains a NUL byte")))
}

fn check(rc: c_int, call: &'static str, what: &str) -> Result<(), Error> {
    if rc < 0 {
        Err(Error::Call {
            call,
            what: what.to_string(),
            errno: -rc,
            errno_text: errno_text(-rc),
        })
    } else {
        Ok(())
    }
}

/// A connected cluster handle and an I/O context on one pool.
pub struct Pool {
    api: &'static Api,
    cluster: Handle,
    ioctx: Handle,
    /// The pool's name (more I/O contexts on it are made from this).
    name: CString,
    /// Set once the cluster refused this client as blocklisted (its image and its watches
    /// alike: one client per gateway and image).
    fenced: Arc<std::sync::atomic::AtomicBool>,
}

// librados handles may be used from any thread.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

impl Pool {
    /// Connects as `client` (without the `client.` prefix) with `conf`, plus `options`.
    pub fn connect(
        conf: &str,
        client: &str,
        options: &[(&str, &str)],
        pool: &str,
    ) -> Result<Pool, Error> {
        let api = api()?;
        let id = cstring(client, "client name")?;
        let mut cluster: Handle = std::ptr::null_mut();
        // SAFETY: `cluster` is a valid out pointer; `id` outlives the call.
        check(
            unsafe { (api.create)(&mut cluster, id.as_ptr()) },
            "rados_create",
            client,
        )?;
        let mut me = Pool {
            api,
            cluster,
            ioctx: std::ptr::null_mut(),
            name: cstring(pool, "pool name")?,
            fenced: Arc::default(),
        };
        let path = cstring(conf, "Ceph configuration path")?;
        // SAFETY: `cluster` was created above and is not shut down yet.
        check(
            unsafe { (api.conf_read_file)(me.cluster, path.as_ptr()) },
            "rados_conf_read_file",
            conf,
        )?;
        for (key, value) in options {
            let (k, v) = (cstring(key, "option")?, cstring(value, "option value")?);
            // SAFETY: as above; both strings outlive the call.
            check(
                unsafe { (api.conf_set)(me.cluster, k.as_ptr(), v.as_ptr()) },
                "rados_conf_set",
                key,
            )?;
        }
        // SAFETY: as above.
        check(unsafe { (api.connect)(me.cluster) }, "rados_connect", conf)?;
        me.ioctx = me.new_ioctx()?;
        Ok(me)
    }

    /// The client's fenced flag, shared by everything that uses the client.
    pub fn fenced(&self) -> &Arc<std::sync::atomic::AtomicBool> {
        &self.fenced
    }

    /// Another I/O context on the pool (the caller destroys it, before the pool drops).
    fn new_ioctx(&self) -> Result<Handle, Error> {
        let mut ioctx: Handle = std::ptr::null_mut();
        // SAFETY: connected cluster; the name outlives the call; valid out pointer.
        check(
            unsafe { (self.api.ioctx_create)(self.cluster, self.name.as_ptr(), &mut ioctx) },
            "rados_ioctx_create",
            &self.name.to_string_lossy(),
        )?;
        Ok(ioctx)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: the handles were created by this value and are released once, here; every
        // image opened on the context is closed first (Image borrows the Pool through Arc).
        unsafe {
            if !self.ioctx.is_null() {
                (self.api.ioctx_destroy)(self.ioctx);
            }
            (self.api.shutdown)(self.cluster);
        }
    }
}

/// An open image.
pub struct Image {
    api: &'static Api,
    image: Handle,
    name: String,
    /// Keeps the pool's handles alive while the image is open.
    _pool: std::sync::Arc<Pool>,
}

// librbd allows concurrent I/O calls on one image handle from several threads.
unsafe impl Send for Image {}
unsafe impl Sync for Image {}

impl Image {
    pub fn open(pool: std::sync::Arc<Pool>, name: &str) -> Result<Image, Error> {
        let api = pool.api;
        let cname = cstring(name, "image name")?;
        let mut image: Handle = std::ptr::null_mut();
        // SAFETY: the pool's context is alive (held by `pool`); valid out pointer; a null
        // snapshot name opens the head.
        check(
            unsafe { (api.open)(pool.ioctx, cname.as_ptr(), &mut image, std::ptr::null()) },
            "rbd_open",
            name,
        )?;
        Ok(Image {
            api,
            image,
            name: name.to_string(),
            _pool: pool,
        })
    }

    fn get_u64(&self, f: GetU64, call: &'static str) -> Result<u64, Error> {
        let mut value = 0u64;
        // SAFETY: open image; valid out pointer.
        check(unsafe { f(self.image, &mut value) }, call, &self.name)?;
        Ok(value)
    }

    pub fn size(&self) -> Result<u64, Error> {
        self.get_u64(self.api.get_size, "rbd_get_size")
    }

    /// The size now (after an `rbd resize` elsewhere).
    pub fn size_now(&self) -> Result<u64, Error> {
        self.size()
    }

    pub fn features(&self) -> Result<u64, Error> {
        self.get_u64(self.api.get_features, "rbd_get_features")
    }

    /// The image's id (stable across renames).
    pub fn id(&self) -> Result<String, Error> {
        let mut buf = [0u8; 64];
        // SAFETY: open image; the buffer and its length.
        check(
            unsafe { (self.api.get_id)(self.image, buf.as_mut_ptr().cast(), buf.len()) },
            "rbd_get_id",
            &self.name,
        )?;
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(buf.get(..end).unwrap_or_default()).into_owned())
    }

    /// Reads `buf.len()` bytes at `offset`; the byte count librbd returned.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        // SAFETY: open image; the buffer is writable for its length.
        let n = unsafe { (self.api.read)(self.image, offset, buf.len(), buf.as_mut_ptr().cast()) };
        usize::try_from(n).map_err(|_| std::io::Error::from_raw_os_error((-n) as i32))
    }

    pub fn write(&self, buf: &[u8], offset: u64) -> std::io::Result<usize> {
        // SAFETY: open image; the buffer is readable for its length.
        let n = unsafe { (self.api.write)(self.image, offset, buf.len(), buf.as_ptr().cast()) };
        usize::try_from(n).map_err(|_| std::io::Error::from_raw_os_error((-n) as i32))
    }

    /// librbd's compare-and-write (atomic at the OSD): `Ok(None)` written, `Ok(Some(off))`
    /// nothing written, the first difference at `off` bytes into the request.
    pub fn compare_and_write(
        &self,
        compare: &[u8],
        write: &[u8],
        offset: u64,
    ) -> std::io::Result<Option<u64>> {
        if compare.len() != write.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "compare and write buffers differ in length",
            ));
        }
        let mut mismatch = 0u64;
        // SAFETY: open image; both buffers are readable for `len`; valid out pointer.
        let n = unsafe {
            (self.api.compare_and_write)(
                self.image,
                offset,
                write.len(),
                compare.as_ptr().cast(),
                write.as_ptr().cast(),
                &mut mismatch,
                0,
            )
        };
        const EILSEQ: isize = 84;
        match n {
            n if n >= 0 => Ok(None),
            n if n == -EILSEQ => Ok(Some(mismatch_in_request(mismatch, offset, write.len()))),
            n => Err(std::io::Error::from_raw_os_error((-n) as i32)),
        }
    }

    pub fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        // SAFETY: open image.
        let rc = unsafe { (self.api.discard)(self.image, offset, len) };
        if rc < 0 {
            Err(std::io::Error::from_raw_os_error(-rc))
        } else {
            Ok(())
        }
    }

    /// librbd's write-same: `pattern` repeated over `len` bytes from `offset` (`len` a
    /// multiple of the pattern's length), sent to the OSDs once, not `len` bytes of it.
    pub fn write_same(&self, offset: u64, len: u64, pattern: &[u8]) -> std::io::Result<()> {
        let whole = usize::try_from(len)
            .ok()
            .filter(|l| !pattern.is_empty() && l.is_multiple_of(pattern.len()));
        let Some(len) = whole else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "write same: the length is not a whole number of patterns",
            ));
        };
        // SAFETY: open image; the pattern is readable for its length.
        let n = unsafe {
            (self.api.write_same)(
                self.image,
                offset,
                len,
                pattern.as_ptr().cast(),
                pattern.len(),
                0,
            )
        };
        if n < 0 {
            Err(std::io::Error::from_raw_os_error((-n) as i32))
        } else {
            Ok(())
        }
    }

    pub fn flush(&self) -> std::io::Result<()> {
        // SAFETY: open image.
        let rc = unsafe { (self.api.flush)(self.image) };
        if rc < 0 {
            Err(std::io::Error::from_raw_os_error(-rc))
        } else {
            Ok(())
        }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: opened by this value, closed once, before the pool (held by `_pool`).
        unsafe {
            (self.api.close)(self.image);
        }
    }
}

/// Where a compare-and-write's first difference lies, in bytes from the start of the request,
/// from what librbd reported. librbd 16.2 reports the image offset of the object holding the
/// range plus the difference's offset in the request (measured: 8 MiB + 300 for a difference
/// at byte 300 of a sector at 8 MiB + 64 KiB), where its header promises the offset in the
/// request; so a release may report the offset in the request, in the image, or the object
/// base plus it, and all three are taken back into the request. Objects start on 512-byte
/// boundaries and a request is at most one 512-byte sector (librbd refuses more), so in the
/// last case the remainder by 512 is the offset in the request.
pub(crate) fn mismatch_in_request(reported: u64, offset: u64, len: usize) -> u64 {
    let len = len as u64;
    if reported < len {
        reported
    } else if reported >= offset && reported - offset < len {
        reported - offset
    } else {
        reported % 512
    }
}

#[cfg(test)]
mod mismatch_tests {
    use super::mismatch_in_request;

    #[test]
    fn every_frame_librbd_may_report_comes_back_into_the_request() {
        let mib = 1u64 << 20;
        // In the request already; in the image; the object's base plus it (librbd 16.2).
        assert_eq!(mismatch_in_request(300, 8 * mib + 65_536, 512), 300);
        assert_eq!(
            mismatch_in_request(8 * mib + 65_536 + 300, 8 * mib + 65_536, 512),
            300
        );
        assert_eq!(
            mismatch_in_request(8 * mib + 300, 8 * mib + 65_536, 512),
            300
        );
        assert_eq!(mismatch_in_request(8 * mib, 8 * mib + 65_536, 512), 0);
        // The first object: all three frames agree.
        assert_eq!(mismatch_in_request(7, 0, 512), 7);
        assert_eq!(mismatch_in_request(512 + 7, 512, 512), 7);
    }
}
