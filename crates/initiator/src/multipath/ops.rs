//! The device's I/O operations: alignment checks, splitting a large request across the
//! eligible paths (and into commands of at most 1 MiB), and reassembling split reads.

use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering;

use super::io::Op;
use super::{Multipath, MAX_COMMAND_BYTES};
use crate::Error;

impl Multipath {
    fn blocks_of(&self, offset: u64, len: u64) -> Result<(u64, u64), Error> {
        let bs = u64::from(self.inner.block_size);
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(Error::InvalidRequest(format!(
                "{len} bytes at {offset} is not aligned to {bs}-byte blocks"
            )));
        }
        let end = offset.checked_add(len).filter(|&e| e <= self.size());
        if end.is_none() {
            return Err(Error::InvalidRequest(format!(
                "{len} bytes at {offset} is beyond the end of the device ({} bytes)",
                self.size()
            )));
        }
        Ok((offset / bs, len / bs))
    }

    /// Pieces of one request: split across eligible paths, then cut at MAX_COMMAND_BYTES.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64)> {
        let paths = self
            .inner
            .slots
            .iter()
            .filter(|s| s.eligible.load(Ordering::Relaxed))
            .count()
            .max(1);
        let bs = u64::from(self.inner.block_size);
        let split = u64::from(self.inner.config.split_threshold);
        mpath::split(offset, len, paths, bs, split, (split / 2).max(bs)).flat_map(move |(o, l)| {
            let n = l.div_ceil(MAX_COMMAND_BYTES).max(1);
            (0..n).map(move |k| {
                let start = o + k * MAX_COMMAND_BYTES;
                (start, (o + l - start).min(MAX_COMMAND_BYTES))
            })
        })
    }

    /// Reads `len` bytes at `offset` (both multiples of the block size).
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, Error> {
        self.blocks_of(offset, u64::from(len))?;
        let bs = u64::from(self.inner.block_size);
        let mut pieces = self.pieces(offset, u64::from(len)).peekable();
        let first = pieces.next();
        if pieces.peek().is_none() {
            let (o, l) = first.unwrap_or((offset, u64::from(len)));
            return self
                .inner
                .submit(Op::Read {
                    lba: o / bs,
                    blocks: (l / bs) as u32,
                })
                .await;
        }
        let parts =
            futures_util::future::try_join_all(first.into_iter().chain(pieces).map(|(o, l)| {
                self.inner.submit(Op::Read {
                    lba: o / bs,
                    blocks: (l / bs) as u32,
                })
            }))
            .await?;
        let mut out = BytesMut::with_capacity(len as usize);
        for p in parts {
            out.extend_from_slice(&p);
        }
        Ok(out.freeze())
    }

    /// Writes `data` at `offset`; with `fua` the target makes it durable before answering.
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), Error> {
        self.blocks_of(offset, data.len() as u64)?;
        let bs = u64::from(self.inner.block_size);
        let pieces: Vec<(u64, u64)> = self.pieces(offset, data.len() as u64).collect();
        if let [(o, _)] = pieces.as_slice() {
            return self
                .inner
                .submit(Op::Write {
                    lba: o / bs,
                    data,
                    fua,
                })
                .await
                .map(|_| ());
        }
        futures_util::future::try_join_all(pieces.iter().map(|&(o, l)| {
            let at = (o - offset) as usize;
            self.inner.submit(Op::Write {
                lba: o / bs,
                data: data.slice(at..at + l as usize),
                fua,
            })
        }))
        .await
        .map(|_| ())
    }

    /// SYNCHRONIZE CACHE: everything written before is durable once this returns.
    pub async fn flush(&self) -> Result<(), Error> {
        self.inner.submit(Op::Flush).await.map(|_| ())
    }

    /// Deallocates (UNMAP) a block range; reads of it then return zeros or the old data.
    pub async fn trim(&self, offset: u64, len: u64) -> Result<(), Error> {
        let (lba, blocks) = self.blocks_of(offset, len)?;
        for (l, n) in chunks(lba, blocks) {
            self.inner.submit(Op::Unmap { lba: l, blocks: n }).await?;
        }
        Ok(())
    }

    /// Writes zeros over a block range (WRITE SAME), deallocating when `unmap` allows it.
    pub async fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        unmap: bool,
        fua: bool,
    ) -> Result<(), Error> {
        let (lba, blocks) = self.blocks_of(offset, len)?;
        for (l, n) in chunks(lba, blocks) {
            self.inner
                .submit(Op::Zero {
                    lba: l,
                    blocks: n,
                    unmap,
                })
                .await?;
        }
        if fua {
            self.flush().await?;
        }
        Ok(())
    }
}

/// Splits a block range into pieces a single UNMAP / WRITE SAME can carry.
fn chunks(lba: u64, blocks: u64) -> impl Iterator<Item = (u64, u32)> {
    const MAX: u64 = 1 << 22;
    let n = blocks.div_ceil(MAX);
    (0..n).map(move |k| {
        let start = lba + k * MAX;
        (start, (lba + blocks - start).min(MAX) as u32)
    })
}
