//! A block device backed by a (normally sparse) regular file.
//!
//! Reads and writes are positional (`pread`/`pwritev`) and take no lock, so many threads can
//! serve one file at once. An exclusive `flock` taken at open keeps two servers off one file.

use crate::{check_range, push_extent, BlockDevice, Extent, OpenError};
use rustix::fs::{FallocateFlags, FlockOperation, SeekFrom};
use rustix::io::ReadWriteFlags;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, IoSlice};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Fills `buf` from `offset` with repeated positional reads (`read` returns bytes read),
/// retrying on EINTR; bytes past the end of a file that shrank underneath us read as zeros.
fn read_fully(
    mut buf: &mut [u8],
    mut offset: u64,
    mut read: impl FnMut(&mut [u8], u64) -> std::io::Result<usize>,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        match read(buf, offset) {
            Ok(0) => {
                buf.fill(0);
                return Ok(());
            }
            Ok(n) => {
                buf = buf.get_mut(n..).unwrap_or_default();
                offset += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A regular file used as a block device.
pub struct FileDevice {
    file: File,
    /// Exported size in bytes; only ever grows ([`BlockDevice::grow`]).
    size: AtomicU64,
    /// Cleared the first time the kernel answers RWF_NOWAIT writes with EOPNOTSUPP (ext4,
    /// which has no buffered NOWAIT writes): from then on every write is a blocking one.
    nowait_writes: AtomicBool,
    /// Cleared the first time the kernel answers RWF_NOWAIT reads with EOPNOTSUPP (tmpfs on
    /// this kernel): from then on every read is a blocking one, without the failed call.
    nowait_reads: AtomicBool,
}

impl FileDevice {
    /// Opens `path`, creating a sparse file of `size` bytes (and its parent directories) when
    /// it does not exist. An existing file keeps its own size; if `size` is given and differs,
    /// opening fails. The file is locked exclusively for the life of the device.
    pub fn open(path: impl AsRef<Path>, size: Option<u64>) -> Result<Self, OpenError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let io = |source| OpenError::Io {
            path: name.clone(),
            source,
        };
        let (file, created) = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => (f, false),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if size.is_none() {
                    return Err(OpenError::NoSize(name));
                }
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent).map_err(io)?;
                }
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .map_err(io)?;
                (f, true)
            }
            Err(e) => return Err(io(e)),
        };
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Err(OpenError::Locked(name)),
            Err(e) => return Err(io(e.into())),
        }
        let actual = file.metadata().map_err(io)?.len();
        let size = match (created, size) {
            (true, Some(s)) => {
                file.set_len(s).map_err(io)?;
                s
            }
            (false, Some(s)) if s != actual => {
                return Err(OpenError::SizeMismatch {
                    path: name,
                    actual,
                    configured: s,
                })
            }
            _ => actual,
        };
        Ok(Self {
            file,
            size: AtomicU64::new(size),
            nowait_writes: AtomicBool::new(true),
            nowait_reads: AtomicBool::new(true),
        })
    }
}

impl BlockDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn grow(&self, size: u64) -> std::io::Result<()> {
        let current = self.size_bytes();
        if size < current {
            return Err(std::io::Error::new(
                ErrorKind::InvalidInput,
                format!("cannot shrink from {current} to {size} bytes"),
            ));
        }
        let meta = self.file.metadata()?;
        if meta.is_file() && meta.len() < size {
            self.file.set_len(size)?;
        } else if !meta.is_file() && meta.len() < size {
            return Err(std::io::Error::new(
                ErrorKind::InvalidInput,
                format!("the device holds only {} bytes", meta.len()),
            ));
        }
        self.size.store(size, Ordering::Release);
        Ok(())
    }

    fn release(&self) {
        let _ = rustix::fs::flock(&self.file, FlockOperation::Unlock);
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        check_range(self.size_bytes(), offset, buf.len() as u64)?;
        read_fully(buf, offset, |b, at| self.file.read_at(b, at))
    }

    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        check_range(self.size_bytes(), offset, buf.len() as u64)?;
        if !self.reads_nowait() {
            return Err(ErrorKind::WouldBlock.into());
        }
        read_fully(buf, offset, |b, at| {
            let mut slices = [std::io::IoSliceMut::new(b)];
            match rustix::io::preadv2(&self.file, &mut slices, at, ReadWriteFlags::NOWAIT) {
                Ok(n) => Ok(n),
                Err(rustix::io::Errno::INTR) => Err(ErrorKind::Interrupted.into()),
                Err(rustix::io::Errno::OPNOTSUPP) => {
                    // The kernel or file system cannot say whether the data is cached.
                    self.nowait_reads.store(false, Ordering::Relaxed);
                    Err(ErrorKind::WouldBlock.into())
                }
                // EAGAIN: not cached.
                Err(_) => Err(ErrorKind::WouldBlock.into()),
            }
        })
    }

    fn reads_nowait(&self) -> bool {
        self.nowait_reads.load(Ordering::Relaxed)
    }

    fn write_vectored_at_nowait(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        check_range(self.size_bytes(), offset, total)?;
        if bufs.len() > 64 {
            return Err(ErrorKind::WouldBlock.into());
        }
        if !self.nowait_writes.load(Ordering::Relaxed) {
            // Without RWF_NOWAIT a buffered write can sleep for seconds (a journal handle
            // waiting on a commit, block allocation in a sparse file, dirty throttling) and
            // stall the connection that runs it: it goes to the blocking pool.
            return Err(ErrorKind::WouldBlock.into());
        }
        let mut slices = [IoSlice::new(&[]); 64];
        for (slot, b) in slices.iter_mut().zip(bufs) {
            *slot = IoSlice::new(b);
        }
        let slices = slices.get(..bufs.len()).unwrap_or_default();
        match rustix::io::pwritev2(&self.file, slices, offset, ReadWriteFlags::NOWAIT) {
            Ok(n) if n as u64 == total => Ok(()),
            Err(rustix::io::Errno::OPNOTSUPP) => {
                self.nowait_writes.store(false, Ordering::Relaxed);
                self.write_vectored_at_nowait(bufs, offset)
            }
            // Partial or EAGAIN: the blocking path writes it all.
            _ => Err(ErrorKind::WouldBlock.into()),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        check_range(self.size_bytes(), offset, buf.len() as u64)?;
        self.file.write_all_at(buf, offset)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        check_range(self.size_bytes(), offset, total)?;
        // pwritev may write partially; resume from the first buffer not fully written.
        let mut done = 0u64;
        let mut first = 0usize;
        let mut skip = 0usize;
        while done < total {
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(bufs.len().min(1024));
            for (i, b) in bufs.iter().enumerate().skip(first).take(1024) {
                let s = if i == first {
                    b.get(skip..).unwrap_or_default()
                } else {
                    b
                };
                slices.push(IoSlice::new(s));
            }
            let n = match rustix::io::pwritev(&self.file, &slices, offset + done) {
                Ok(0) => return Err(std::io::Error::new(ErrorKind::WriteZero, "pwritev wrote 0")),
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
            done += n as u64;
            let mut left = n;
            while left > 0 {
                let Some(b) = bufs.get(first) else { break };
                let rest = b.len() - skip;
                if left >= rest {
                    left -= rest;
                    first += 1;
                    skip = 0;
                } else {
                    skip += left;
                    left = 0;
                }
            }
            // Skip empty buffers so `first` always points at pending bytes.
            while bufs.get(first).is_some_and(|b| b.len() == skip) {
                first += 1;
                skip = 0;
            }
        }
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        rustix::fs::fdatasync(&self.file).map_err(Into::into)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        check_range(self.size_bytes(), offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(&self.file, flags, offset, len) {
            Ok(()) => Ok(()),
            // Filesystems without hole punching: write zeros so the range still reads back zero.
            Err(rustix::io::Errno::OPNOTSUPP) => {
                let zeros = vec![0u8; 1 << 20];
                let mut at = offset;
                let end = offset + len;
                while at < end {
                    let n = (end - at).min(zeros.len() as u64) as usize;
                    self.file
                        .write_all_at(zeros.get(..n).unwrap_or_default(), at)?;
                    at += n as u64;
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn allocation_map(&self, offset: u64, len: u64) -> std::io::Result<Vec<Extent>> {
        check_range(self.size_bytes(), offset, len)?;
        let end = offset + len;
        let mut out = Vec::new();
        let mut at = offset;
        while at < end {
            let pos = i64::try_from(at).map_err(|_| crate::out_of_range())?;
            let data = match rustix::fs::seek(&self.file, SeekFrom::Data(pos)) {
                Ok(d) => d.min(end),
                Err(rustix::io::Errno::NXIO) => end,
                // No SEEK_DATA support: report everything as allocated.
                Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::OPNOTSUPP) => {
                    push_extent(&mut out, at, end - at, true);
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            push_extent(&mut out, at, data - at, false);
            if data >= end {
                break;
            }
            let dpos = i64::try_from(data).map_err(|_| crate::out_of_range())?;
            let hole = match rustix::fs::seek(&self.file, SeekFrom::Hole(dpos)) {
                Ok(h) => h.min(end),
                Err(rustix::io::Errno::NXIO) => end,
                Err(e) => return Err(e.into()),
            };
            push_extent(&mut out, data, hole - data, true);
            at = hole;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nowait_io_completes_from_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let d = FileDevice::open(dir.path().join("v.img"), Some(1 << 20)).unwrap();
        let data = vec![0xa5u8; 8192];
        // A buffered write may or may not be accepted without sleeping; either way the
        // blocking path leaves the data in the page cache.
        if d.write_vectored_at_nowait(&[&data[..4096], &data[4096..]], 4096)
            .is_err()
        {
            d.write_vectored_at(&[&data], 4096).unwrap();
        }
        let mut back = vec![0u8; 8192];
        d.read_at_nowait(&mut back, 4096)
            .expect("cached data reads without waiting");
        assert_eq!(back, data);
        assert!(
            d.read_at_nowait(&mut back, (1 << 20) - 10).is_err(),
            "range checked"
        );
    }

    #[test]
    fn nowait_reads_stop_once_the_file_system_cannot_do_them() {
        // tmpfs answers RWF_NOWAIT reads with EOPNOTSUPP on some kernels (Debian 12's 6.1),
        // ext4 serves them from the page cache: whichever this machine has, the device says
        // so afterwards and never loses data.
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let d = FileDevice::open(dir.path().join("v.img"), Some(1 << 20)).unwrap();
        let data = vec![0x3cu8; 4096];
        d.write_at(&data, 8192).unwrap();
        let mut back = vec![0u8; 4096];
        match d.read_at_nowait(&mut back, 8192) {
            Ok(()) => {
                assert_eq!(back, data);
                assert!(d.reads_nowait(), "it worked, so it is kept");
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::WouldBlock);
                assert!(
                    !d.reads_nowait(),
                    "tmpfs data is always in memory: unsupported"
                );
            }
        }
        d.nowait_reads.store(false, Ordering::Relaxed);
        let e = d.read_at_nowait(&mut back, 8192).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock, "off means off");
        d.read_at(&mut back, 8192).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn without_nowait_writes_no_write_is_done_inline() {
        let dir = tempfile::tempdir().unwrap();
        let d = FileDevice::open(dir.path().join("v.img"), Some(1 << 20)).unwrap();
        d.nowait_writes.store(false, Ordering::Relaxed);
        let data = [0x5au8; 512];
        let e = d.write_vectored_at_nowait(&[&data], 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        let mut back = [0u8; 512];
        d.read_at(&mut back, 0).unwrap();
        assert_eq!(back, [0u8; 512], "nothing was written");
    }

    #[test]
    fn create_lock_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/dir/vol.img");
        assert!(matches!(
            FileDevice::open(&p, None),
            Err(OpenError::NoSize(_))
        ));
        let d = FileDevice::open(&p, Some(1 << 20)).unwrap();
        assert_eq!(d.size_bytes(), 1 << 20);
        assert!(matches!(
            FileDevice::open(&p, None),
            Err(OpenError::Locked(_))
        ));
        d.release();
        let d2 = FileDevice::open(&p, None).expect("released: another device may open it");
        assert_eq!(d2.size_bytes(), 1 << 20);
        drop((d, d2));
        assert!(matches!(
            FileDevice::open(&p, Some(4096)),
            Err(OpenError::SizeMismatch { .. })
        ));
    }

    #[test]
    fn grows_but_never_shrinks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vol.img");
        let d = FileDevice::open(&p, Some(1 << 20)).unwrap();
        let block = vec![7u8; 4096];
        assert!(d.write_at(&block, 1 << 20).is_err(), "beyond the end");
        d.grow(2 << 20).unwrap();
        assert_eq!(d.size_bytes(), 2 << 20);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 2 << 20);
        d.write_at(&block, 1 << 20).unwrap();
        assert!(d.grow(1 << 20).is_err());
        assert_eq!(d.size_bytes(), 2 << 20);
    }

    #[test]
    fn io_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vol.img");
        let d = FileDevice::open(&p, Some(4 << 20)).unwrap();
        let a = vec![0xAAu8; 3000];
        let b = vec![0xBBu8; 70000];
        d.write_vectored_at(&[&a, &[], &b], 4096).unwrap();
        let mut back = vec![0u8; 73000];
        d.read_at(&mut back, 4096).unwrap();
        assert_eq!(&back[..3000], &a[..]);
        assert_eq!(&back[3000..], &b[..]);
        d.flush().unwrap();
        let map = d.allocation_map(0, 4 << 20).unwrap();
        assert!(map.iter().any(|e| e.allocated));
        assert!(map.iter().any(|e| !e.allocated));
        assert_eq!(map.iter().map(|e| e.len).sum::<u64>(), 4 << 20);
        d.punch_hole(0, 1 << 20).unwrap();
        d.read_at(&mut back, 4096).unwrap();
        assert!(back.iter().all(|&x| x == 0));
        let map = d.allocation_map(0, 1 << 20).unwrap();
        assert_eq!(
            map,
            vec![Extent {
                offset: 0,
                len: 1 << 20,
                allocated: false
            }]
        );
        assert!(d.write_at(&[1], 4 << 20).is_err());
    }
}
