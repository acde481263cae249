//! Byte-granular access to a [`Device`]: reads of the covering blocks, sliced; writes and
//! zeroing with read-modify-write of the partial edge blocks; requests larger than
//! [`Device::max_io`] split. Every write-type request holds its covering blocks in a range
//! lock while it runs, so two clients writing different bytes of one block at the same time
//! both land, and a block is never a mix of two read-modify-writes.

use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::device::{validate, Device};
use crate::range_lock::RangeLock;
use crate::ExportError;

/// A [`Device`] with byte-granular reads and writes. Every writer of a device must go through
/// the same `AlignedIo` for the range lock to protect them from each other: all connections of
/// an NBD export do; to serve one device over NBD and FUSE at once, create one and pass it to
/// [`crate::NbdServer::serve_aligned`] and [`crate::FuseExport::mount_aligned`].
#[derive(Debug)]
pub struct AlignedIo<D> {
    dev: Arc<D>,
    lock: RangeLock,
    block: u64,
    size: u64,
    max_io: u64,
}

/// How the whole blocks of a zeroed range reach the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zeroing {
    /// [`Device::write_zeroes`].
    WriteZeroes,
    /// [`Device::trim`] where the device guarantees trimmed blocks read as zeroes, else
    /// [`Device::write_zeroes`] (a FUSE hole punch).
    TrimIfZeroing,
}

impl<D: Device> AlignedIo<D> {
    /// Wraps a device after checking its geometry (see [`Device`]).
    pub fn new(dev: Arc<D>) -> Result<AlignedIo<D>, ExportError> {
        validate(dev.as_ref())?;
        Ok(AlignedIo {
            block: u64::from(dev.block_size()),
            size: dev.size(),
            max_io: u64::from(dev.max_io()),
            lock: RangeLock::default(),
            dev,
        })
    }

    /// The wrapped device.
    pub fn device(&self) -> &Arc<D> {
        &self.dev
    }

    /// Device size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Reads `len` bytes at any `offset`.
    pub async fn read(&self, offset: u64, len: u32) -> io::Result<Bytes> {
        let end = self.check_range(offset, u64::from(len))?;
        if len == 0 {
            return Ok(Bytes::new());
        }
        let start = self.round_down(offset);
        let cover_end = self.round_up(end);
        let skip = (offset - start) as usize;
        if cover_end - start <= self.max_io {
            let data = self.read_blocks(start, cover_end - start).await?;
            return Ok(data.slice(skip..skip + len as usize));
        }
        // Larger than one device call: gather the pieces.
        let mut out = BytesMut::with_capacity(len as usize);
        let mut pos = start;
        while pos < cover_end {
            let piece = (cover_end - pos).min(self.max_io);
            let data = self.read_blocks(pos, piece).await?;
            let from = offset.saturating_sub(pos).min(piece) as usize;
            let to = (end.min(pos + piece) - pos) as usize;
            out.extend_from_slice(data.get(from..to).unwrap_or_default());
            pos += piece;
        }
        Ok(out.freeze())
    }

    /// Writes `data` at any `offset`; with `fua` every device write it makes is FUA.
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> io::Result<()> {
        let end = self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let start = self.round_down(offset);
        let cover_end = self.round_up(end);
        let _guard = self.lock.lock(start, cover_end).await;
        if cover_end - start == self.block && (offset != start || end != cover_end) {
            // Inside one block.
            let at = (offset - start) as usize;
            return self
                .patch_block(start, fua, |block| copy_into(block, at, &data))
                .await;
        }
        let mut rest = data;
        let mut pos = offset;
        if offset != start {
            let at = (offset - start) as usize;
            let head = rest.split_to(self.block as usize - at);
            self.patch_block(start, fua, |block| copy_into(block, at, &head))
                .await?;
            pos = start + self.block;
        }
        let tail_start = self.round_down(end);
        if end != tail_start {
            let tail = rest.split_off((tail_start - pos) as usize);
            self.patch_block(tail_start, fua, |block| copy_into(block, 0, &tail))
                .await?;
        }
        // The aligned middle, in pieces the device takes, without copying.
        while !rest.is_empty() {
            let piece = rest.split_to(rest.len().min(self.max_io as usize));
            let len = piece.len() as u64;
            self.dev.write(pos, piece, fua).await?;
            pos += len;
        }
        Ok(())
    }

    /// Makes `len` bytes at any `offset` read back as zeroes.
    pub async fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        how: Zeroing,
    ) -> io::Result<()> {
        let end = self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let start = self.round_down(offset);
        let cover_end = self.round_up(end);
        let _guard = self.lock.lock(start, cover_end).await;
        let head_partial = offset != start;
        let tail_start = self.round_down(end);
        let tail_partial = end != tail_start;
        if cover_end - start == self.block && (head_partial || tail_partial) {
            let (at, to) = ((offset - start) as usize, (end - start) as usize);
            return self
                .patch_block(start, fua, |block| zero_part(block, at, to))
                .await;
        }
        let mut middle_start = start;
        if head_partial {
            let at = (offset - start) as usize;
            self.patch_block(start, fua, |block| zero_part(block, at, usize::MAX))
                .await?;
            middle_start = start + self.block;
        }
        if tail_partial {
            let to = (end - tail_start) as usize;
            self.patch_block(tail_start, fua, |block| zero_part(block, 0, to))
                .await?;
        }
        if middle_start < tail_start {
            let middle = tail_start - middle_start;
            if how == Zeroing::TrimIfZeroing && self.dev.trim_reads_zeroes() {
                self.dev.trim(middle_start, middle).await?;
                if fua {
                    self.dev.flush().await?;
                }
            } else {
                self.dev.write_zeroes(middle_start, middle, fua).await?;
            }
        }
        Ok(())
    }

    /// Discards the whole blocks inside `[offset, offset + len)`: a hint, so partial edge
    /// blocks are left as they are (proto.md allows rounding a trim inwards).
    pub async fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = self.check_range(offset, len)?;
        let start = self.round_up(offset);
        let stop = self.round_down(end);
        if start >= stop {
            return Ok(());
        }
        let _guard = self.lock.lock(start, stop).await;
        self.dev.trim(start, stop - start).await
    }

    /// Makes every completed write durable.
    pub async fn flush(&self) -> io::Result<()> {
        self.dev.flush().await
    }

    /// Reads whole blocks and checks the device kept its promise on the length.
    async fn read_blocks(&self, offset: u64, len: u64) -> io::Result<Bytes> {
        let data = self.dev.read(offset, len as u32).await?;
        if data.len() as u64 != len {
            return Err(io::Error::other(format!(
                "device returned {} bytes for a {len}-byte read",
                data.len()
            )));
        }
        Ok(data)
    }

    /// Read-modify-write of one block; the caller holds the block in the range lock.
    async fn patch_block(
        &self,
        offset: u64,
        fua: bool,
        patch: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        let old = self.read_blocks(offset, self.block).await?;
        let mut block = BytesMut::from(&old[..]);
        patch(&mut block);
        self.dev.write(offset, block.freeze(), fua).await
    }

    /// `offset + len` if the range lies inside the device.
    fn check_range(&self, offset: u64, len: u64) -> io::Result<u64> {
        offset
            .checked_add(len)
            .filter(|&end| end <= self.size)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{len} bytes at {offset} go beyond the device end {}",
                        self.size
                    ),
                )
            })
    }

    fn round_down(&self, offset: u64) -> u64 {
        offset - offset % self.block
    }

    /// Rounds up; cannot overflow for offsets up to the device size (a block multiple).
    fn round_up(&self, offset: u64) -> u64 {
        offset.div_ceil(self.block) * self.block
    }
}

fn copy_into(block: &mut [u8], at: usize, data: &[u8]) {
    if let Some(dst) = block.get_mut(at..at + data.len()) {
        dst.copy_from_slice(data);
    }
}

fn zero_part(block: &mut [u8], from: usize, to: usize) {
    let to = to.min(block.len());
    if let Some(dst) = block.get_mut(from..to) {
        dst.fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryDevice;
    use proptest::prelude::*;

    fn setup(max_io: u32) -> (Arc<MemoryDevice>, AlignedIo<MemoryDevice>, Vec<u8>) {
        let size = 256 * 1024;
        let dev = Arc::new(
            MemoryDevice::new(size, 4096)
                .unwrap()
                .with_max_io(max_io)
                .unwrap(),
        );
        let pattern: Vec<u8> = (0..size as usize).map(|i| (i % 251) as u8 + 1).collect();
        dev.write_bytes(0, &pattern).unwrap();
        (dev.clone(), AlignedIo::new(dev).unwrap(), pattern)
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    proptest! {
        #[test]
        fn byte_granular_ops_match_a_model(
            ops in proptest::collection::vec((0u8..4, 0u64..256 * 1024, 0u64..40_000, any::<u8>()), 1..12),
            max_io in prop_oneof![Just(4096u32), Just(16384), Just(1 << 20)],
        ) {
            let (dev, io, mut model) = setup(max_io);
            run(async {
                for (kind, offset, len, fill) in ops {
                    let len = len.min(model.len() as u64 - offset);
                    let range = offset as usize..(offset + len) as usize;
                    match kind {
                        0 => {
                            let got = io.read(offset, len as u32).await.unwrap();
                            prop_assert_eq!(&got[..], &model[range]);
                        }
                        1 => {
                            io.write(offset, Bytes::from(vec![fill; len as usize]), fill % 2 == 0).await.unwrap();
                            model[range].fill(fill);
                        }
                        2 => {
                            let how = if fill % 2 == 0 { Zeroing::WriteZeroes } else { Zeroing::TrimIfZeroing };
                            io.write_zeroes(offset, len, false, how).await.unwrap();
                            model[range].fill(0);
                        }
                        _ => {
                            io.trim(offset, len).await.unwrap();
                            // Only whole blocks inside the range are discarded (to zeroes here).
                            let start = offset.div_ceil(4096) * 4096;
                            let stop = (offset + len) / 4096 * 4096;
                            if start < stop {
                                model[start as usize..stop as usize].fill(0);
                            }
                        }
                    }
                }
                Ok(())
            })?;
            prop_assert_eq!(&dev.read_bytes(0, model.len()).unwrap()[..], &model[..]);
        }
    }

    #[test]
    fn out_of_range_is_an_error_not_a_panic() {
        let (_dev, io, _) = setup(1 << 20);
        run(async {
            assert!(io.read(256 * 1024 - 1, 2).await.is_err());
            assert!(io.read(u64::MAX, 2).await.is_err());
            assert!(io
                .write(u64::MAX - 1, Bytes::from_static(b"ab"), false)
                .await
                .is_err());
            assert!(io
                .write_zeroes(1, u64::MAX, false, Zeroing::WriteZeroes)
                .await
                .is_err());
            assert!(io.trim(u64::MAX, 1).await.is_err());
            assert_eq!(io.read(256 * 1024, 0).await.unwrap().len(), 0);
        });
    }

    #[test]
    fn device_errors_propagate() {
        let (dev, io, _) = setup(1 << 20);
        dev.set_failing(true);
        run(async {
            assert!(io.read(0, 4096).await.is_err());
            assert!(io
                .write(100, Bytes::from_static(b"x"), false)
                .await
                .is_err());
            assert!(io.flush().await.is_err());
        });
    }
}
