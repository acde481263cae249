//! A test harness for durability: a device whose writes stay in process memory, like a disk's
//! volatile write cache, until a flush moves them to the backing device. A missing flush then
//! shows up as lost data: kill -9 of the process (or [`VolatileDevice::power_loss`]) loses
//! exactly what a power loss would, which kill -9 of a plain file backend cannot show because
//! the kernel's page cache survives the process.
//!
//! Semantics: writes land in a per-sector (512-byte) cache; reads see the cache over the
//! backing device; `flush` writes every cached sector to the backing device (in ascending
//! order, so a kill during a flush tears it at sector granularity, as a disk can) and flushes
//! it. Deallocation (UNMAP) goes straight to the backing device. Never use it for data that
//! matters: that is its point.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{check_range, push_extent, BlockDevice, Extent};

/// The cache's unit: what a disk writes atomically.
pub const SECTOR: u64 = 512;

pub struct VolatileDevice {
    inner: Arc<dyn BlockDevice>,
    /// Unflushed sectors by index. The lock is held across a flush, so a read never sees a
    /// sector that left the cache but has not reached the backing device.
    cache: Mutex<BTreeMap<u64, Box<[u8]>>>,
}

fn io_error(what: &str) -> std::io::Error {
    std::io::Error::other(what.to_string())
}

impl VolatileDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> Self {
        Self {
            inner,
            cache: Mutex::new(BTreeMap::new()),
        }
    }

    /// Sectors written and not yet flushed.
    pub fn unflushed_sectors(&self) -> usize {
        self.cache.lock().len()
    }

    /// Simulates a power loss: the cache is gone. With `seed`, a pseudo-random subset of the
    /// cached sectors reaches the backing device first (a disk that wrote part of its cache in
    /// its own order), so writes are torn and reordered at sector granularity. Returns the
    /// number of sectors that landed.
    pub fn power_loss(&self, seed: Option<u64>) -> std::io::Result<usize> {
        let mut cache = self.cache.lock();
        let mut landed = 0;
        if let Some(mut state) = seed {
            for (sector, data) in cache.iter() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                if state % 2 == 0 {
                    self.inner.write_at(data, sector * SECTOR)?;
                    landed += 1;
                }
            }
        }
        cache.clear();
        Ok(landed)
    }

    /// One sector as the device shows it now (cache over backing device).
    fn current_sector(
        &self,
        cache: &BTreeMap<u64, Box<[u8]>>,
        sector: u64,
    ) -> std::io::Result<Box<[u8]>> {
        if let Some(data) = cache.get(&sector) {
            return Ok(data.clone());
        }
        let mut data = vec![0u8; SECTOR as usize].into_boxed_slice();
        let end = ((sector + 1) * SECTOR).min(self.inner.size_bytes());
        let start = sector * SECTOR;
        if end > start {
            let part = data
                .get_mut(..(end - start) as usize)
                .ok_or_else(|| io_error("sector bounds"))?;
            self.inner.read_at(part, start)?;
        }
        Ok(data)
    }

    fn write_locked(
        &self,
        cache: &mut BTreeMap<u64, Box<[u8]>>,
        buf: &[u8],
        offset: u64,
    ) -> std::io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let sector = at / SECTOR;
            let within = (at % SECTOR) as usize;
            let take = (SECTOR as usize - within).min(buf.len() - done);
            let source = buf
                .get(done..done + take)
                .ok_or_else(|| io_error("write bounds"))?;
            let mut data = if within == 0 && take == SECTOR as usize {
                vec![0u8; SECTOR as usize].into_boxed_slice()
            } else {
                self.current_sector(cache, sector)?
            };
            data.get_mut(within..within + take)
                .ok_or_else(|| io_error("sector bounds"))?
                .copy_from_slice(source);
            cache.insert(sector, data);
            done += take;
        }
        Ok(())
    }
}

impl BlockDevice for VolatileDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        check_range(self.size_bytes(), offset, buf.len() as u64)?;
        let cache = self.cache.lock();
        self.inner.read_at(buf, offset)?;
        if buf.is_empty() {
            return Ok(());
        }
        let first = offset / SECTOR;
        let last = (offset + buf.len() as u64 - 1) / SECTOR;
        for (sector, data) in cache.range(first..=last) {
            let start = (sector * SECTOR).max(offset);
            let end = ((sector + 1) * SECTOR).min(offset + buf.len() as u64);
            let from = data
                .get((start - sector * SECTOR) as usize..(end - sector * SECTOR) as usize)
                .ok_or_else(|| io_error("sector bounds"))?;
            buf.get_mut((start - offset) as usize..(end - offset) as usize)
                .ok_or_else(|| io_error("read bounds"))?
                .copy_from_slice(from);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        check_range(self.size_bytes(), offset, buf.len() as u64)?;
        let mut cache = self.cache.lock();
        self.write_locked(&mut cache, buf, offset)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        check_range(self.size_bytes(), offset, total)?;
        let mut cache = self.cache.lock();
        let mut at = offset;
        for buf in bufs {
            self.write_locked(&mut cache, buf, at)?;
            at += buf.len() as u64;
        }
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        let mut cache = self.cache.lock();
        let mut run: Vec<u8> = Vec::new();
        let mut run_start = 0u64;
        let mut next = None;
        for (sector, data) in cache.iter() {
            if next != Some(*sector) && !run.is_empty() {
                self.inner.write_at(&run, run_start * SECTOR)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = *sector;
            }
            run.extend_from_slice(data);
            next = Some(sector + 1);
        }
        if !run.is_empty() {
            self.inner.write_at(&run, run_start * SECTOR)?;
        }
        cache.clear();
        self.inner.flush()
    }

    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        check_range(self.size_bytes(), offset, len)?;
        let mut cache = self.cache.lock();
        if len == 0 {
            return Ok(());
        }
        let first = offset / SECTOR;
        let last = (offset + len - 1) / SECTOR;
        let partial: Vec<u64> = [first, last]
            .into_iter()
            .filter(|s| *s * SECTOR < offset || (*s + 1) * SECTOR > offset + len)
            .filter(|s| cache.contains_key(s))
            .collect();
        let whole: Vec<u64> = cache
            .range(first..=last)
            .map(|(s, _)| *s)
            .filter(|s| !partial.contains(s))
            .collect();
        for sector in whole {
            cache.remove(&sector);
        }
        for sector in partial {
            let start = (sector * SECTOR).max(offset);
            let end = ((sector + 1) * SECTOR).min(offset + len);
            let zeros = vec![0u8; (end - start) as usize];
            self.write_locked(&mut cache, &zeros, start)?;
        }
        self.inner.punch_hole(offset, len)
    }

    fn allocation_map(&self, offset: u64, len: u64) -> std::io::Result<Vec<Extent>> {
        let cache = self.cache.lock();
        let inner = self.inner.allocation_map(offset, len)?;
        if len == 0 {
            return Ok(inner);
        }
        let end = offset + len;
        let cached: Vec<(u64, u64)> = cache
            .range(offset / SECTOR..=(end - 1) / SECTOR)
            .map(|(s, _)| ((s * SECTOR).max(offset), ((s + 1) * SECTOR).min(end)))
            .collect();
        let mut points: Vec<u64> = inner
            .iter()
            .flat_map(|e| [e.offset, e.offset + e.len])
            .chain(cached.iter().flat_map(|(a, b)| [*a, *b]))
            .filter(|p| (offset..=end).contains(p))
            .chain([offset, end])
            .collect();
        points.sort_unstable();
        points.dedup();
        let mut out = Vec::new();
        for pair in points.windows(2) {
            let (a, b) = match pair {
                [a, b] => (*a, *b),
                _ => continue,
            };
            let allocated = cached.iter().any(|(s, e)| *s <= a && a < *e)
                || inner
                    .iter()
                    .any(|x| x.allocated && x.offset <= a && a < x.offset + x.len);
            push_extent(&mut out, a, b - a, allocated);
        }
        Ok(out)
    }

    fn grow(&self, size: u64) -> std::io::Result<()> {
        self.inner.grow(size)
    }

    fn release(&self) {
        self.inner.release();
    }

    fn holes_read_zero(&self) -> bool {
        self.inner.holes_read_zero()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryDevice;

    fn device() -> (Arc<MemoryDevice>, VolatileDevice) {
        let backing = Arc::new(MemoryDevice::new(64 * 1024));
        let volatile = VolatileDevice::new(backing.clone());
        (backing, volatile)
    }

    fn read(dev: &dyn BlockDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        dev.read_at(&mut buf, offset).unwrap();
        buf
    }

    #[test]
    fn unflushed_writes_are_seen_but_lost_at_power_loss_and_flushed_ones_stay() {
        let (backing, dev) = device();
        dev.write_at(&[1u8; 4096], 0).unwrap();
        dev.flush().unwrap();
        dev.write_vectored_at(&[&[2u8; 100][..], &[3u8; 924][..]], 8192)
            .unwrap();
        // Unaligned: a partial sector over flushed data.
        dev.write_at(&[9u8; 10], 4090).unwrap();
        assert_eq!(read(&dev, 8192, 100), vec![2u8; 100]);
        assert_eq!(read(&dev, 8292, 924), vec![3u8; 924]);
        assert_eq!(read(&dev, 4086, 4), vec![1u8; 4]);
        assert_eq!(read(&dev, 4090, 6), vec![9u8; 6]);
        assert_eq!(read(backing.as_ref(), 8192, 100), vec![0u8; 100]);
        assert_eq!(dev.power_loss(None).unwrap(), 0);
        assert_eq!(read(&dev, 8192, 1024), vec![0u8; 1024]);
        assert_eq!(read(&dev, 0, 4096), vec![1u8; 4096]);
        assert_eq!(dev.unflushed_sectors(), 0);
    }

    #[test]
    fn a_flush_moves_everything_and_a_torn_power_loss_lands_whole_sectors_only() {
        let (backing, dev) = device();
        dev.write_at(&[5u8; 512 * 40], 0).unwrap();
        dev.write_at(&[6u8; 512 * 3], 512 * 50).unwrap();
        dev.flush().unwrap();
        assert_eq!(read(backing.as_ref(), 0, 512 * 40), vec![5u8; 512 * 40]);
        assert_eq!(
            read(backing.as_ref(), 512 * 50, 512 * 3),
            vec![6u8; 512 * 3]
        );
        dev.write_at(&[7u8; 512 * 64], 0).unwrap();
        let landed = dev.power_loss(Some(42)).unwrap();
        assert!(landed > 0 && landed < 64, "{landed} of 64 sectors landed");
        let after = read(&dev, 0, 512 * 64);
        let mut new = 0;
        for (i, sector) in after.chunks(512).enumerate() {
            let first = sector[0];
            assert!(
                sector.iter().all(|b| *b == first),
                "a sector mixes old and new"
            );
            let old = match i {
                0..40 => 5,
                50..53 => 6,
                _ => 0,
            };
            assert!(first == 7 || first == old, "sector {i} holds {first}");
            new += usize::from(first == 7);
        }
        assert_eq!(new, landed);
    }

    #[test]
    fn unmap_passes_through_and_allocation_counts_cached_sectors() {
        let (_, dev) = device();
        dev.write_at(&[1u8; 2048], 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[2u8; 1024], 4096).unwrap();
        dev.punch_hole(256, 1024).unwrap();
        assert_eq!(read(&dev, 0, 256), vec![1u8; 256]);
        assert_eq!(read(&dev, 256, 1024), vec![0u8; 1024]);
        assert_eq!(read(&dev, 1280, 768), vec![1u8; 768]);
        // Cached data inside a hole of the backing device reads and maps as data.
        dev.punch_hole(4096 + 512, 256).unwrap();
        assert_eq!(read(&dev, 4096 + 512, 256), vec![0u8; 256]);
        assert_eq!(read(&dev, 4096 + 768, 256), vec![2u8; 256]);
        let map = dev.allocation_map(4096, 1024).unwrap();
        assert!(map.iter().all(|e| e.allocated), "{map:?}");
        assert_eq!(map.iter().map(|e| e.len).sum::<u64>(), 1024);
        assert!(dev.write_at(&[0u8; 10], 64 * 1024 - 5).is_err());
    }
}
