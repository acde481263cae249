//! Block storage backends for lanes: a sparse file (pread/pwrite, punch hole) and memory, and
//! a volatile write cache over either for durability tests ([`VolatileDevice`]).
//!
//! Every backend implements [`BlockDevice`], a synchronous positional-I/O interface that is safe to
//! call from many threads at once: the file backend takes no lock on the read/write path because
//! `pread`/`pwrite` on one descriptor are independent system calls.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod aio;
mod file;
mod memory;
pub mod volatile;

pub use aio::{aio_pair, AioCompletion, AioWait, AsyncBlockIo, ReadDone};
pub use file::FileDevice;
pub use memory::MemoryDevice;
pub use volatile::VolatileDevice;

/// One run of a device's address space and whether it holds data (`true`) or is a hole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Byte offset of the run.
    pub offset: u64,
    /// Length of the run in bytes.
    pub len: u64,
    /// `true` when the run is backed by storage, `false` when it reads back zeros from a hole.
    pub allocated: bool,
}

/// Errors that opening a backend can produce.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file exists with a different size than the one configured.
    #[error("{path}: existing size {actual} differs from configured size {configured}")]
    SizeMismatch {
        /// The file opened.
        path: String,
        /// Its size on disk.
        actual: u64,
        /// The size asked for.
        configured: u64,
    },
    /// Another process (or another device in this process) holds the file's lock.
    #[error("{0}: in use by another server (lock held)")]
    Locked(String),
    /// A new file needs a size.
    #[error("{0}: does not exist and no size was given")]
    NoSize(String),
    /// Any other I/O failure.
    #[error("{path}: {source}")]
    Io {
        /// The file opened.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// A linear array of bytes that SCSI logical units are built on.
///
/// All methods take `&self` and may be called concurrently; callers serialise overlapping
/// writes themselves when they need ordering (COMPARE AND WRITE does).
pub trait BlockDevice: Send + Sync + 'static {
    /// Size of the device in bytes.
    fn size_bytes(&self) -> u64;
    /// Fills `buf` from `offset`; ranges past the end of a sparse file read as zeros.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()>;
    /// Writes the concatenation of `bufs` at `offset` without concatenating them first.
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()>;
    /// Makes every completed write durable (`fdatasync`).
    fn flush(&self) -> std::io::Result<()>;
    /// Deallocates a range; it reads back zeros afterwards.
    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()>;
    /// Describes `[offset, offset+len)` as a list of allocated/hole runs covering it exactly.
    fn allocation_map(&self, offset: u64, len: u64) -> std::io::Result<Vec<Extent>>;
    /// `true` when holes read back as zeros (LBPRZ); both backends do.
    /// `read_at` that never sleeps: `ErrorKind::WouldBlock` when the data is not already in
    /// memory (page cache), so an event-loop thread can serve cached reads inline and hand the
    /// rest to a blocking pool. The default never completes inline.
    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let _ = (buf, offset);
        Err(std::io::ErrorKind::WouldBlock.into())
    }

    /// Whether `read_at_nowait` can complete at all, so a caller skips preparing a buffer for
    /// a call that would only say `WouldBlock`. The default never completes inline.
    fn reads_nowait(&self) -> bool {
        false
    }

    /// `write_vectored_at` for an event-loop thread: completes only if it is short (a copy
    /// into memory that waits for no disk I/O), `ErrorKind::WouldBlock` otherwise, possibly
    /// after part of the data was written (the caller then writes it all again, which is
    /// idempotent). The file backend uses RWF_NOWAIT where the kernel and file system support
    /// it for buffered writes (XFS, btrfs); elsewhere (ext4) every write is a blocking one.
    fn write_vectored_at_nowait(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        let _ = (bufs, offset);
        Err(std::io::ErrorKind::WouldBlock.into())
    }

    /// Grows the device to `size` bytes (extending a file as needed); never shrinks. Ranges
    /// checked after it returns see the new size. The default cannot grow.
    fn grow(&self, size: u64) -> std::io::Result<()> {
        let _ = size;
        Err(std::io::ErrorKind::Unsupported.into())
    }

    /// The size the storage itself reports now, for a device whose size a tool outside lanes
    /// can change (an RBD image after `rbd resize`); None for one that only lanes grows. A
    /// blocking call (it may ask the storage).
    fn size_from_storage(&self) -> Option<std::io::Result<u64>> {
        None
    }

    /// The storage refuses this server for good (an RBD client blocklisted by the cluster):
    /// its target port groups go unavailable so hosts use other paths.
    fn fenced(&self) -> bool {
        false
    }

    /// A device [`fenced`](Self::fenced) by its storage tries once to come back on a new
    /// connection (an RBD gateway: a new client, which the cluster has not blocklisted);
    /// whether it serves again. A blocking call (it asks the storage).
    fn reconnect(&self) -> std::io::Result<bool> {
        Ok(!self.fenced())
    }

    /// WRITE SAME done by the storage itself: `pattern` (one block) repeated over `len` bytes
    /// from `offset`, without the caller sending every copy. None: the device has no such
    /// operation and the caller writes the copies. A blocking call.
    fn write_same(&self, offset: u64, len: u64, pattern: &[u8]) -> Option<std::io::Result<()>> {
        let _ = (offset, len, pattern);
        None
    }

    /// For storage that other servers export too (the gateways of a shared RBD image):
    /// publishes this server's target port groups with their ALUA state codes (SPC-4: 0
    /// active/optimized .. 3 unavailable, 0xF transitioning), and returns those the other
    /// servers publish, so that every path reports the same states. None for storage that only
    /// this server exports. A blocking call (it asks the storage).
    fn share_port_groups(&self, mine: &[(u16, u8)]) -> Option<std::io::Result<Vec<(u16, u8)>>> {
        let _ = mine;
        None
    }

    /// COMPARE AND WRITE done by the storage itself: if `[offset, offset + compare.len())`
    /// equals `compare`, write `write` (same length) there, atomically against every client of
    /// the storage (other gateways of a shared image included). `None`: the device has no such
    /// operation and the caller emulates it (atomic within this process only). `Some(Ok(None))`:
    /// written; `Some(Ok(Some(i)))`: nothing written, the first difference is at byte `i`.
    fn compare_and_write(
        &self,
        compare: &[u8],
        write: &[u8],
        offset: u64,
    ) -> Option<std::io::Result<Option<u64>>> {
        let _ = (compare, write, offset);
        None
    }

    /// The longest range, in bytes, the device's own [`BlockDevice::compare_and_write`]
    /// takes (`None`: any the SCSI layer sends). librbd's compare-and-write covers one
    /// 512-byte sector; the logical unit then reports that limit in its Block Limits page and
    /// refuses longer COMPARE AND WRITEs rather than let them fail as write errors.
    fn compare_and_write_max(&self) -> Option<u64> {
        None
    }

    /// The device's asynchronous I/O, for storage that completes requests by itself (an
    /// RBD image through `rbd_aio_*`): READs and WRITEs then wait on no thread. `None` (the
    /// default): every call above is a blocking one. A device that returns `Some` also does
    /// its own [`BlockDevice::compare_and_write`], atomic against its asynchronous writes.
    fn aio(&self) -> Option<&dyn AsyncBlockIo> {
        None
    }

    /// Gives up the device's claim on its backing store (the file lock), so another device may
    /// open it, when it is taken out of service; I/O already under way still completes.
    fn release(&self) {}

    fn holes_read_zero(&self) -> bool {
        true
    }

    /// Whether a write without FUA, with the write cache on, waits for nothing but this
    /// machine (page cache, local kernel), so that it may queue behind other such writes on a
    /// few shared threads. A device whose writes wait for other machines (the HA pair's peer,
    /// Ceph's OSDs) says no: a peer being lost or slow must not hold up every other LUN's
    /// writes, and waiting for a round trip two at a time would cap its throughput.
    fn writes_stay_local(&self) -> bool {
        true
    }

    /// Whether a write may end inside a block (the file and memory backends write any byte
    /// range). A device that keeps whole blocks only (the HA pair replicates blocks) says no,
    /// and a WRITE whose data-out ends inside a block is refused before anything is written.
    fn writes_partial_blocks(&self) -> bool {
        true
    }
}

pub(crate) fn out_of_range() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        "range beyond end of device",
    )
}

/// Checks that `[offset, offset+len)` lies inside a device of `size` bytes.
pub(crate) fn check_range(size: u64, offset: u64, len: u64) -> std::io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(out_of_range()),
    }
}

/// Merges adjacent runs with the same allocation state.
pub(crate) fn push_extent(out: &mut Vec<Extent>, offset: u64, len: u64, allocated: bool) {
    if len == 0 {
        return;
    }
    if let Some(last) = out.last_mut() {
        if last.allocated == allocated && last.offset + last.len == offset {
            last.len += len;
            return;
        }
    }
    out.push(Extent {
        offset,
        len,
        allocated,
    });
}
