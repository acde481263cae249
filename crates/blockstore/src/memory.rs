//! An in-memory block device for tests and scratch volumes.
//!
//! Data lives in fixed-size chunks, each behind its own lock, so concurrent I/O to different
//! chunks does not contend. A chunk that was never written or was punched is `None` (a hole).

use crate::{check_range, push_extent, BlockDevice, Extent};
use parking_lot::RwLock;

const CHUNK: u64 = 4096;

/// A sparse byte array in memory.
pub struct MemoryDevice {
    size: u64,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl MemoryDevice {
    /// A zero-filled device of `size` bytes (nothing is allocated until written).
    pub fn new(size: u64) -> Self {
        let n = size.div_ceil(CHUNK);
        let chunks = (0..n).map(|_| RwLock::new(None)).collect();
        Self { size, chunks }
    }

    /// Calls `f(chunk index, offset inside chunk, position in the caller's buffer, length)`
    /// for each chunk piece of `[offset, offset+len)`.
    fn for_each_piece(offset: u64, len: u64, mut f: impl FnMut(usize, usize, usize, usize)) {
        let mut pos = 0u64;
        while pos < len {
            let abs = offset + pos;
            let idx = abs / CHUNK;
            let within = abs % CHUNK;
            let n = (CHUNK - within).min(len - pos);
            f(idx as usize, within as usize, pos as usize, n as usize);
            pos += n;
        }
    }

    fn write_piece(&self, idx: usize, within: usize, data: &[u8]) {
        if let Some(lock) = self.chunks.get(idx) {
            let mut chunk = lock.write();
            let c = chunk.get_or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            if let Some(dst) = c.get_mut(within..within + data.len()) {
                dst.copy_from_slice(data);
            }
        }
    }
}

impl BlockDevice for MemoryDevice {
    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        Self::for_each_piece(offset, buf.len() as u64, |idx, within, pos, n| {
            let Some(dst) = buf.get_mut(pos..pos + n) else {
                return;
            };
            match self.chunks.get(idx).map(|l| l.read()) {
                Some(guard) => match guard.as_ref().and_then(|c| c.get(within..within + n)) {
                    Some(src) => dst.copy_from_slice(src),
                    None => dst.fill(0),
                },
                None => dst.fill(0),
            }
        });
        Ok(())
    }

    fn reads_nowait(&self) -> bool {
        true
    }

    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.read_at(buf, offset)
    }

    fn write_vectored_at_nowait(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        self.write_vectored_at(bufs, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        Self::for_each_piece(offset, buf.len() as u64, |idx, within, pos, n| {
            if let Some(src) = buf.get(pos..pos + n) {
                self.write_piece(idx, within, src);
            }
        });
        Ok(())
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        check_range(self.size, offset, total)?;
        let mut at = offset;
        for b in bufs {
            self.write_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }

    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        check_range(self.size, offset, len)?;
        Self::for_each_piece(offset, len, |idx, within, _pos, n| {
            let Some(lock) = self.chunks.get(idx) else {
                return;
            };
            let mut chunk = lock.write();
            if within == 0 && n as u64 == CHUNK {
                *chunk = None;
            } else if let Some(dst) = chunk.as_mut().and_then(|c| c.get_mut(within..within + n)) {
                dst.fill(0);
            }
        });
        Ok(())
    }

    fn allocation_map(&self, offset: u64, len: u64) -> std::io::Result<Vec<Extent>> {
        check_range(self.size, offset, len)?;
        let mut out = Vec::new();
        Self::for_each_piece(offset, len, |idx, within, _pos, n| {
            let allocated = self.chunks.get(idx).is_some_and(|l| l.read().is_some());
            push_extent(
                &mut out,
                idx as u64 * CHUNK + within as u64,
                n as u64,
                allocated,
            );
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_punch() {
        let d = MemoryDevice::new(5 * 4096 + 100);
        let data: Vec<u8> = (0..10000u32).map(|i| i as u8).collect();
        d.write_vectored_at(&[&data[..3000], &data[3000..]], 1000)
            .unwrap();
        let mut back = vec![0u8; 10000];
        d.read_at(&mut back, 1000).unwrap();
        assert_eq!(back, data);
        d.punch_hole(4096, 4096).unwrap();
        d.read_at(&mut back, 1000).unwrap();
        assert!(back[3096..7192].iter().all(|&b| b == 0));
        let map = d.allocation_map(0, 3 * 4096).unwrap();
        assert_eq!(
            map,
            vec![
                Extent {
                    offset: 0,
                    len: 4096,
                    allocated: true
                },
                Extent {
                    offset: 4096,
                    len: 4096,
                    allocated: false
                },
                Extent {
                    offset: 8192,
                    len: 4096,
                    allocated: true
                },
            ]
        );
        assert!(d.write_at(&[1], 5 * 4096 + 100).is_err());
        assert!(d.read_at(&mut [0u8; 2], u64::MAX).is_err());
    }
}
