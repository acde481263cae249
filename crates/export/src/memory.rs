//! A sparse in-memory [`Device`]: fixed-size chunks allocated on first non-zero write, each
//! behind its own lock, so concurrent I/O to different chunks never contends.

use std::future::{ready, Future};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::RwLock;

use crate::device::{Device, MAX_BLOCK_SIZE};
use crate::ExportError;

/// Allocation granule. A multiple of every allowed block size, so a block never straddles two
/// chunks and a single block is always written under one lock (no torn blocks).
const CHUNK: usize = MAX_BLOCK_SIZE as usize;

/// Counters of the calls a [`MemoryDevice`] received, for tests that check how requests map.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    pub reads: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub write_zeroes: u64,
    /// Chunks currently allocated (64 KiB each).
    pub allocated_chunks: u64,
}

/// A sparse in-memory block device: zeroes until written, trimmed ranges read back as zeroes.
#[derive(Debug)]
pub struct MemoryDevice {
    size: u64,
    block_size: u32,
    max_io: u32,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
    failing: AtomicBool,
    reads: AtomicU64,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    write_zeroes: AtomicU64,
}

impl MemoryDevice {
    /// A zeroed device of `size` bytes (a multiple of `block_size`, a power of two from 512 to
    /// 65536).
    pub fn new(size: u64, block_size: u32) -> Result<MemoryDevice, ExportError> {
        let chunk_count = usize::try_from(size.div_ceil(CHUNK as u64))
            .map_err(|_| ExportError::InvalidDevice(format!("size {size} is too large")))?;
        let dev = MemoryDevice {
            size,
            block_size,
            max_io: 4 << 20,
            chunks: (0..chunk_count).map(|_| RwLock::new(None)).collect(),
            failing: AtomicBool::new(false),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            fua_writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            trims: AtomicU64::new(0),
            write_zeroes: AtomicU64::new(0),
        };
        crate::device::validate(&dev)?;
        Ok(dev)
    }

    /// Sets the largest read or write the exports pass down (a multiple of the block size).
    pub fn with_max_io(mut self, max_io: u32) -> Result<MemoryDevice, ExportError> {
        self.max_io = max_io;
        crate::device::validate(&self)?;
        Ok(self)
    }

    /// While set, every call fails with EIO (to test error paths).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// The calls received so far.
    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            fua_writes: self.fua_writes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            trims: self.trims.load(Ordering::Relaxed),
            write_zeroes: self.write_zeroes.load(Ordering::Relaxed),
            allocated_chunks: self.chunks.iter().filter(|c| c.read().is_some()).count() as u64,
        }
    }

    /// Reads any byte range (no alignment needed), for checking contents in tests.
    pub fn read_bytes(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        let mut out = BytesMut::with_capacity(len);
        self.for_each_chunk(offset, len as u64, |chunk, range| {
            match chunk.read().as_deref() {
                Some(data) => out.extend_from_slice(slice(data, range.clone())?),
                None => out.put_bytes(0, range.len()),
            }
            Ok(())
        })?;
        Ok(out.freeze())
    }

    /// Writes any byte range (no alignment needed), for preparing contents in tests.
    pub fn write_bytes(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut rest = data;
        self.for_each_chunk(offset, data.len() as u64, |chunk, range| {
            let (part, tail) = rest.split_at(range.len().min(rest.len()));
            rest = tail;
            let mut guard = chunk.write();
            if guard.is_none() {
                if part.iter().all(|&b| b == 0) {
                    // Zeroes into a hole: nothing to store.
                    return Ok(());
                }
                *guard = Some(vec![0u8; CHUNK].into_boxed_slice());
            }
            if let Some(data) = guard.as_deref_mut() {
                slice_mut(data, range)?.copy_from_slice(part);
            }
            Ok(())
        })
    }

    /// Zeroes a byte range, freeing the chunks it covers whole.
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        self.for_each_chunk(offset, len, |chunk, range| {
            let mut guard = chunk.write();
            if range.len() == CHUNK {
                *guard = None;
            } else if let Some(data) = guard.as_deref_mut() {
                slice_mut(data, range)?.fill(0);
            }
            Ok(())
        })
    }

    /// Calls `f` for each chunk the byte range touches, with the part of the chunk it covers.
    fn for_each_chunk(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(&RwLock<Option<Box<[u8]>>>, std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.size)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "beyond end of device"))?;
        let mut pos = offset;
        while pos < end {
            let index = (pos / CHUNK as u64) as usize;
            let start = (pos % CHUNK as u64) as usize;
            let take = (CHUNK - start).min((end - pos) as usize);
            let chunk = self
                .chunks
                .get(index)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no such chunk"))?;
            f(chunk, start..start + take)?;
            pos += take as u64;
        }
        Ok(())
    }

    fn check(&self) -> io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(io::Error::other("memory device set to fail"));
        }
        Ok(())
    }
}

fn slice(data: &[u8], range: std::ops::Range<usize>) -> io::Result<&[u8]> {
    data.get(range)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "range outside chunk"))
}

fn slice_mut(data: &mut [u8], range: std::ops::Range<usize>) -> io::Result<&mut [u8]> {
    data.get_mut(range)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "range outside chunk"))
}

impl Device for MemoryDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn max_io(&self) -> u32 {
        self.max_io
    }

    fn trim_reads_zeroes(&self) -> bool {
        true
    }

    fn read(&self, offset: u64, len: u32) -> impl Future<Output = io::Result<Bytes>> + Send {
        self.reads.fetch_add(1, Ordering::Relaxed);
        ready(
            self.check()
                .and_then(|()| self.read_bytes(offset, len as usize)),
        )
    }

    fn write(
        &self,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> impl Future<Output = io::Result<()>> + Send {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        ready(self.check().and_then(|()| self.write_bytes(offset, &data)))
    }

    fn flush(&self) -> impl Future<Output = io::Result<()>> + Send {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        ready(self.check())
    }

    fn trim(&self, offset: u64, len: u64) -> impl Future<Output = io::Result<()>> + Send {
        self.trims.fetch_add(1, Ordering::Relaxed);
        ready(self.check().and_then(|()| self.zero_range(offset, len)))
    }

    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        _fua: bool,
    ) -> impl Future<Output = io::Result<()>> + Send {
        self.write_zeroes.fetch_add(1, Ordering::Relaxed);
        ready(self.check().and_then(|()| self.zero_range(offset, len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_until_written_and_trim_frees() {
        let dev = MemoryDevice::new(1 << 20, 512).unwrap();
        assert_eq!(dev.read_bytes(1000, 100).unwrap(), vec![0u8; 100]);
        dev.write_bytes(CHUNK as u64 - 3, &[7u8; 6]).unwrap();
        assert_eq!(dev.stats().allocated_chunks, 2);
        assert_eq!(
            &dev.read_bytes(CHUNK as u64 - 4, 8).unwrap()[..],
            &[0, 7, 7, 7, 7, 7, 7, 0]
        );
        dev.write_bytes(0, &[0u8; 4096]).unwrap();
        assert_eq!(
            dev.stats().allocated_chunks,
            2,
            "zeroes into a hole allocate nothing"
        );
        dev.zero_range(0, 2 * CHUNK as u64).unwrap();
        assert_eq!(dev.stats().allocated_chunks, 0);
        assert!(dev.read_bytes((1 << 20) - 1, 2).is_err());
    }

    #[test]
    fn rejects_bad_geometry() {
        assert!(MemoryDevice::new(1000, 512).is_err());
        assert!(MemoryDevice::new(4096, 1000).is_err());
        assert!(MemoryDevice::new(4096, 512)
            .unwrap()
            .with_max_io(1000)
            .is_err());
    }
}
