//! The FUSE export: a directory holding one regular file, `disk`, whose bytes are the device.
//!
//! fuser runs the session on its own threads (one `/dev/fuse` clone each). Each request is
//! spawned onto the tokio runtime and answered from there, so a slow device call never holds
//! a FUSE thread and many requests run at once. Writes are answered only once the device
//! acknowledged them (write-through: no writeback cache), so `fsync` is real.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};
use rustix::mount::UnmountFlags;
use tokio::runtime::Handle;

use crate::aligned::{AlignedIo, Zeroing};
use crate::{Device, ExportError};

const DISK: INodeNo = INodeNo(2);
const DISK_NAME: &str = "disk";
/// Nothing about the tree ever changes, and the disk's size is fixed: the kernel may keep
/// entries and attributes as long as it likes.
const TTL: Duration = Duration::from_secs(3600);
/// fallocate(2) modes (linux/falloc.h).
const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;
/// Largest read or write the kernel sends in one request (FUSE's default page limit).
const MAX_WRITE: u32 = 1 << 20;

/// How the FUSE file is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuseOptions {
    /// Open the file with `FOPEN_DIRECT_IO`: no page cache for `disk`, every read and write
    /// reaches the device. Avoids caching the data twice under a loop device (the filesystem
    /// on top caches it already) and keeps the file coherent with other exports of the same
    /// device (an NBD client writing at the same time).
    pub direct_io: bool,
    /// FUSE session threads (each only reads requests and hands them to the runtime).
    pub threads: usize,
}

impl Default for FuseOptions {
    fn default() -> FuseOptions {
        FuseOptions {
            direct_io: true,
            threads: 2,
        }
    }
}

/// A mounted FUSE export; see the module documentation.
#[derive(Debug)]
pub struct FuseExport {
    dir: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl FuseExport {
    /// Mounts a filesystem on `dir` with one regular file `disk` of `dev.size()` bytes (mode
    /// 0600, owned by the mounting user); read/write/fsync/fallocate(PUNCH_HOLE|ZERO_RANGE)/
    /// flush map to the device. Returns once mounted. Blocking.
    pub fn mount<D: Device>(
        dev: Arc<D>,
        dir: &Path,
        runtime: Handle,
    ) -> Result<FuseExport, ExportError> {
        FuseExport::mount_with(dev, dir, runtime, FuseOptions::default())
    }

    /// [`mount`](FuseExport::mount) with explicit options.
    pub fn mount_with<D: Device>(
        dev: Arc<D>,
        dir: &Path,
        runtime: Handle,
        options: FuseOptions,
    ) -> Result<FuseExport, ExportError> {
        FuseExport::mount_aligned(Arc::new(AlignedIo::new(dev)?), dir, runtime, options)
    }

    /// [`mount_with`](FuseExport::mount_with) through an [`AlignedIo`] shared with other
    /// exports of the same device (an [`crate::NbdServer`]), so that their read-modify-writes
    /// of partial blocks are serialized against each other too.
    pub fn mount_aligned<D: Device>(
        io: Arc<AlignedIo<D>>,
        dir: &Path,
        runtime: Handle,
        options: FuseOptions,
    ) -> Result<FuseExport, ExportError> {
        let now = SystemTime::now();
        let fs = DiskFs {
            io,
            runtime,
            options,
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            mounted_at: now,
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("lanes".into()),
            MountOption::Subtype("lanes".into()),
            MountOption::DefaultPermissions,
            MountOption::NoAtime,
        ];
        config.n_threads = Some(options.threads.max(1));
        config.clone_fd = true;
        let session = fuser::Session::new(fs, dir, &config)
            .and_then(fuser::Session::spawn)
            .map_err(|e| ExportError::io(format!("mounting FUSE on {}", dir.display()), e))?;
        tracing::info!(dir = %dir.display(), "FUSE export mounted");
        Ok(FuseExport {
            dir: dir.to_path_buf(),
            session: Some(session),
        })
    }

    /// The exported file, `DIR/disk`.
    pub fn disk_path(&self) -> PathBuf {
        self.dir.join(DISK_NAME)
    }

    /// Unmounts, waits for the session threads (the device is flushed as the session ends)
    /// and returns. If the file is still in use (a loop device on it), the error says so and
    /// the mount is detached lazily instead: gone from the directory tree, served until its
    /// last user lets go. (A loop device detached a moment ago may still hold the file: the
    /// kernel releases its backing file asynchronously.) Blocking: on a runtime, call it from
    /// `spawn_blocking` (the final device flush runs on the runtime and is given up after 10 s
    /// if the runtime cannot run it).
    pub fn unmount(mut self) -> Result<(), ExportError> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        match rustix::mount::unmount(&self.dir, UnmountFlags::empty()) {
            Ok(()) => session
                .join()
                .map_err(|e| ExportError::io("FUSE session ended with an error", e)),
            Err(e) => {
                detach(&self.dir, session);
                Err(ExportError::io(
                    format!(
                        "unmounting FUSE on {} (detached lazily)",
                        self.dir.display()
                    ),
                    e.into(),
                ))
            }
        }
    }
}

impl Drop for FuseExport {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            match rustix::mount::unmount(&self.dir, UnmountFlags::empty()) {
                Ok(()) => {
                    session.join().ok();
                }
                Err(_) => detach(&self.dir, session),
            }
        }
    }
}

/// Lazily unmounts a busy mount. The session is left to end by itself when the kernel lets go
/// of the filesystem; it must not try to unmount `dir` again then (something else may be
/// mounted there by that time), hence the forget.
fn detach(dir: &Path, session: fuser::BackgroundSession) {
    if let Err(e) = rustix::mount::unmount(dir, UnmountFlags::DETACH) {
        tracing::warn!(dir = %dir.display(), error = %e, "lazy unmount of FUSE export failed");
    }
    std::mem::forget(session);
}

/// The filesystem: inode 1 is the root directory, inode 2 the disk.
struct DiskFs<D> {
    io: Arc<AlignedIo<D>>,
    runtime: Handle,
    options: FuseOptions,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
}

impl<D: Device> DiskFs<D> {
    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            INodeNo::ROOT => (FileType::Directory, 0o755, 0, 2),
            DISK => (FileType::RegularFile, 0o600, self.io.size(), 1),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.io.device().block_size().max(4096),
            flags: 0,
        })
    }

    /// Runs a device call on the runtime; the reply is sent from there.
    fn spawn(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        self.runtime.spawn(work);
    }
}

fn eio(what: &str, e: &io::Error) -> Errno {
    tracing::warn!(error = %e, "FUSE {what} failed on the device");
    Errno::EIO
}

impl<D: Device> Filesystem for DiskFs<D> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Best effort: the kernel may cap these lower.
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        // Lets the kernel cut one large direct I/O into several requests in flight at once
        // (a loop device issues one synchronous read or write at a time per bio).
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO);
        Ok(())
    }

    fn destroy(&mut self) {
        // The session is over: make everything written durable. Every close already sent a
        // flush, so this is a last safety net; it is bounded, because the runtime may be busy
        // (or, single-threaded, blocked in the very `unmount` call that got us here).
        let io = Arc::clone(&self.io);
        let (done, result) = std::sync::mpsc::channel();
        self.runtime.spawn(async move {
            let _ = done.send(io.flush().await);
        });
        match result.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "flushing the device at FUSE unmount failed"),
            Err(_) => tracing::warn!("no device flush at FUSE unmount: the runtime did not run it"),
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match (parent, self.attr(DISK)) {
            (INodeNo::ROOT, Some(attr)) if name == DISK_NAME => {
                reply.entry(&TTL, &attr, Generation(0))
            }
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(attr) = self.attr(ino) else {
            return reply.error(Errno::ENOENT);
        };
        // The disk cannot grow or shrink (O_TRUNC would wipe it), and its owner and mode say
        // who may use the device. Time updates are accepted and forgotten.
        let resize = size.is_some_and(|size| size != attr.size);
        let chmod = mode.is_some_and(|mode| mode & 0o7777 != u32::from(attr.perm));
        if resize
            || chmod
            || uid.is_some_and(|u| u != attr.uid)
            || gid.is_some_and(|g| g != attr.gid)
        {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &attr)
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != DISK {
            return reply.error(Errno::EISDIR);
        }
        let flags = if self.options.direct_io {
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle(0), flags)
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != DISK {
            return reply.error(Errno::EISDIR);
        }
        let end = self.io.size();
        if offset >= end {
            return reply.data(&[]);
        }
        let len = u64::from(size).min(end - offset) as u32;
        let io = Arc::clone(&self.io);
        self.spawn(async move {
            match io.read(offset, len).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(eio("read", &e)),
            }
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != DISK {
            return reply.error(Errno::EISDIR);
        }
        let end = self.io.size();
        if offset >= end && !data.is_empty() {
            // Like the end of a block device: the file cannot grow.
            return reply.error(Errno::ENOSPC);
        }
        let len = (data.len() as u64).min(end - offset) as usize;
        let data = Bytes::copy_from_slice(data.get(..len).unwrap_or_default());
        // O_SYNC / O_DSYNC writers get FUA writes.
        let fua = flags.0
            & (rustix::fs::OFlags::SYNC.bits() as i32 | rustix::fs::OFlags::DSYNC.bits() as i32)
            != 0;
        let io = Arc::clone(&self.io);
        self.spawn(async move {
            match io.write(offset, data, fua).await {
                Ok(()) => reply.written(len as u32),
                Err(e) => reply.error(eio("write", &e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.flush_device(reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.flush_device(reply);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != DISK {
            return reply.error(Errno::EISDIR);
        }
        let size = self.io.size();
        let Some(end) = offset.checked_add(length) else {
            return reply.error(Errno::EINVAL);
        };
        let keep_size = mode & FALLOC_FL_KEEP_SIZE != 0;
        let how = match mode & !FALLOC_FL_KEEP_SIZE {
            FALLOC_FL_PUNCH_HOLE => Zeroing::TrimIfZeroing,
            FALLOC_FL_ZERO_RANGE => Zeroing::WriteZeroes,
            // Plain preallocation: the disk is all there already, but it cannot grow.
            0 if end <= size || keep_size => return reply.ok(),
            0 => return reply.error(Errno::EFBIG),
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        if end > size && !keep_size {
            return reply.error(Errno::EFBIG);
        }
        // Past the end there is nothing to zero.
        let end = end.min(size);
        let offset = offset.min(end);
        let io = Arc::clone(&self.io);
        self.spawn(async move {
            match io.write_zeroes(offset, end - offset, false, how).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(eio("fallocate", &e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (DISK, FileType::RegularFile, DISK_NAME),
        ];
        for (index, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            // The offset handed back is where the next readdir call resumes.
            if reply.add(*ino, index as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions itself (default_permissions).
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let block = self.io.device().block_size();
        let blocks = self.io.size() / u64::from(block);
        reply.statfs(blocks, 0, 0, 2, 0, block, 255, block)
    }
}

impl<D: Device> DiskFs<D> {
    fn flush_device(&self, reply: ReplyEmpty) {
        let io = Arc::clone(&self.io);
        self.spawn(async move {
            match io.flush().await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(eio("flush", &e)),
            }
        });
    }
}
