//! The block device an export serves, and the checks an export makes on it before serving.

use std::future::Future;
use std::io;

use bytes::Bytes;

use crate::ExportError;

/// A block device an export serves. Offsets and lengths given to it are always multiples of
/// [`block_size`](Device::block_size) (the export layer does read-modify-write for unaligned
/// client requests, see [`crate::aligned`]), lie inside [`size`](Device::size), and reads and
/// writes are at most [`max_io`](Device::max_io) bytes long.
///
/// Several calls may be in flight at once, also on overlapping ranges; the export layer
/// serializes writes that touch the same blocks, so a device need not.
pub trait Device: Send + Sync + 'static {
    /// Logical block size in bytes: a power of two, 512 to 65536.
    fn block_size(&self) -> u32;
    /// Size in bytes, a multiple of the block size.
    fn size(&self) -> u64;
    /// Reads `len` bytes at `offset`; the result is exactly `len` bytes long.
    fn read(&self, offset: u64, len: u32) -> impl Future<Output = io::Result<Bytes>> + Send;
    /// Writes `data` at `offset`; with `fua`, returns only once the data is durable.
    fn write(
        &self,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> impl Future<Output = io::Result<()>> + Send;
    /// Makes every write completed before this call durable.
    fn flush(&self) -> impl Future<Output = io::Result<()>> + Send;
    /// Tells the device the range is no longer needed (discard/unmap). The contents afterwards
    /// are unspecified unless [`trim_reads_zeroes`](Device::trim_reads_zeroes) says otherwise.
    fn trim(&self, offset: u64, len: u64) -> impl Future<Output = io::Result<()>> + Send;
    /// Makes the range read back as zeroes (the device may deallocate it to do so).
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
    ) -> impl Future<Output = io::Result<()>> + Send;
    /// The largest single read or write the export passes down; a multiple of the block size.
    fn max_io(&self) -> u32 {
        4 << 20
    }
    /// Whether trimmed blocks are guaranteed to read back as zeroes. A FUSE hole punch must
    /// leave zeroes behind (the loop driver implements WRITE ZEROES with it), so it is passed
    /// to [`trim`](Device::trim) only when this is true and to
    /// [`write_zeroes`](Device::write_zeroes) otherwise.
    fn trim_reads_zeroes(&self) -> bool {
        false
    }
}

/// The largest logical block size an NBD minimum block size may advertise (proto.md, "Size
/// constraints": MUST NOT be larger than 2^16).
pub(crate) const MAX_BLOCK_SIZE: u32 = 1 << 16;

/// Checks the promises of [`Device`] that the exports rely on for their arithmetic.
pub(crate) fn validate<D: Device>(dev: &D) -> Result<(), ExportError> {
    let block = dev.block_size();
    if !block.is_power_of_two() || !(512..=MAX_BLOCK_SIZE).contains(&block) {
        return Err(ExportError::InvalidDevice(format!(
            "block size {block} is not a power of two between 512 and {MAX_BLOCK_SIZE}"
        )));
    }
    if !dev.size().is_multiple_of(u64::from(block)) {
        return Err(ExportError::InvalidDevice(format!(
            "size {} is not a multiple of the block size {block}",
            dev.size()
        )));
    }
    let max_io = dev.max_io();
    if max_io < block || !max_io.is_multiple_of(block) {
        return Err(ExportError::InvalidDevice(format!(
            "max_io {max_io} is not a positive multiple of the block size {block}"
        )));
    }
    Ok(())
}
