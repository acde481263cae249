//! Block I/O commands: READ, WRITE, VERIFY, WRITE SAME, UNMAP, COMPARE AND WRITE and
//! GET LBA STATUS (SBC-3 5).

use crate::cdb::BlockRange;
use crate::lun::{
    LogicalUnit, MAX_CAW_BLOCKS, MAX_TRANSFER_BYTES, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS,
    MAX_WRITE_SAME_BLOCKS,
};
use crate::sense::Sense;
use crate::{gather, put_truncated, ScsiRequest};
use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering;

fn data_len(data: &[Bytes]) -> u64 {
    data.iter().map(|b| b.len() as u64).sum()
}

/// The first `n` bytes of the data-out segments, as slices.
/// How a command may do its I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Io {
    /// On a thread that may sleep.
    Blocking,
    /// On an event-loop thread: complete only from memory, never sleep.
    NoWait,
}

/// The first `n` bytes of `data` as slices in `out`; returns how many slots were used.
fn fill_first_bytes<'a>(data: &'a [Bytes], n: u64, out: &mut [&'a [u8]]) -> usize {
    let mut left = n as usize;
    let mut used = 0;
    for (seg, slot) in data.iter().zip(out.iter_mut()) {
        if left == 0 {
            break;
        }
        let take = seg.len().min(left);
        *slot = seg.get(..take).unwrap_or_default();
        left -= take;
        used += 1;
    }
    used
}

fn first_bytes(data: &[Bytes], n: u64) -> Vec<&[u8]> {
    let mut left = n as usize;
    let mut v = Vec::with_capacity(data.len());
    for seg in data {
        if left == 0 {
            break;
        }
        let take = seg.len().min(left);
        v.push(seg.get(..take).unwrap_or_default());
        left -= take;
    }
    v
}

impl LogicalUnit {
    /// MAXIMUM COMPARE AND WRITE LENGTH in blocks: 255, or less when the device's own
    /// compare-and-write takes less (an RBD image: one 512-byte sector).
    pub(crate) fn max_caw_blocks(&self) -> u32 {
        match self.cfg.device.compare_and_write_max() {
            Some(bytes) => MAX_CAW_BLOCKS.min(u32::try_from(bytes / self.bs()).unwrap_or(u32::MAX)),
            None => MAX_CAW_BLOCKS,
        }
    }

    fn bs(&self) -> u64 {
        u64::from(self.cfg.block_size)
    }

    pub(crate) fn check_transfer(&self, r: &BlockRange) -> Result<(), Sense> {
        self.check_range(r.lba, u64::from(r.blocks))?;
        if u64::from(r.blocks) * self.bs() > MAX_TRANSFER_BYTES {
            return Err(Sense::invalid_cdb(0, None));
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self) -> Result<(), Sense> {
        if self.cfg.read_only {
            return Err(Sense::write_protected());
        }
        Ok(())
    }

    /// Flushes when the cache is off or the command asked for FUA.
    fn complete_write(&self, fua: bool) -> Result<(), Sense> {
        if fua || !self.wce.load(Ordering::Relaxed) {
            self.cfg
                .device
                .flush()
                .map_err(|e| Sense::device(&e, Sense::write_error()))?;
        }
        Ok(())
    }

    /// READ. With `Io::NoWait`, `Ok(false)` means the data is not in memory and nothing was
    /// done (the caller retries on a blocking thread).
    pub(crate) fn read(&self, r: BlockRange, out: &mut BytesMut, io: Io) -> Result<bool, Sense> {
        self.check_transfer(&r)?;
        if io == Io::NoWait && !self.cfg.device.reads_nowait() {
            return Ok(false);
        }
        let n = (u64::from(r.blocks) * self.bs()) as usize;
        let start = out.len();
        out.resize(start + n, 0);
        let buf = out.get_mut(start..).unwrap_or_default();
        let offset = r.lba * self.bs();
        let result = match io {
            Io::Blocking => self.cfg.device.read_at(buf, offset),
            Io::NoWait => self.cfg.device.read_at_nowait(buf, offset),
        };
        match result {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && io == Io::NoWait => {
                out.truncate(start);
                Ok(false)
            }
            Err(e) => Err(Sense::device(&e, Sense::read_error())),
        }
    }

    /// WRITE: writes min(CDB length, bytes the initiator sent) (FCP-4 / libiscsi residual tests);
    /// on a device that keeps whole blocks only, data-out that ends inside a block is refused
    /// (INVALID FIELD IN INFORMATION UNIT) and nothing is written. With `Io::NoWait`, `Ok(false)` means it could not complete without sleeping (a flush is
    /// due, a COMPARE AND WRITE holds the range, or the page cache cannot take it now); the
    /// caller retries on a blocking thread, rewriting the same bytes.
    pub(crate) fn write(
        &self,
        req: &ScsiRequest<'_>,
        r: BlockRange,
        io: Io,
    ) -> Result<bool, Sense> {
        self.check_writable()?;
        self.check_transfer(&r)?;
        if r.blocks == 0 {
            return Ok(true);
        }
        let n = (u64::from(r.blocks) * self.bs()).min(data_len(req.data_out));
        if !n.is_multiple_of(self.bs()) && !self.cfg.device.writes_partial_blocks() {
            return Err(Sense::invalid_field_in_iu());
        }
        let end = r.lba + u64::from(r.blocks);
        let offset = r.lba * self.bs();
        if io == Io::NoWait {
            if r.fua || !self.wce.load(Ordering::Relaxed) || req.data_out.len() > 16 {
                return Ok(false);
            }
            let Some(guard) = self.caw.try_write(r.lba, end) else {
                return Ok(false);
            };
            let mut slices: [&[u8]; 16] = [&[]; 16];
            let count = fill_first_bytes(req.data_out, n, &mut slices);
            let done = self
                .cfg
                .device
                .write_vectored_at_nowait(slices.get(..count).unwrap_or_default(), offset)
                .is_ok();
            drop(guard);
            return Ok(done);
        }
        let bufs = first_bytes(req.data_out, n);
        let guard = self.caw.write(r.lba, end);
        self.cfg
            .device
            .write_vectored_at(&bufs, offset)
            .map_err(|e| Sense::device(&e, Sense::write_error()))?;
        drop(guard);
        self.complete_write(r.fua)?;
        Ok(true)
    }

    pub(crate) fn verify(
        &self,
        req: &ScsiRequest<'_>,
        r: BlockRange,
        bytchk: u8,
    ) -> Result<(), Sense> {
        self.check_transfer(&r)?;
        if r.blocks == 0 || bytchk == 0 {
            return Ok(());
        }
        let len = u64::from(r.blocks) * self.bs();
        let expect = match bytchk {
            // One block of data-out compared against every block of the range.
            3 => {
                let one = gather(req.data_out, self.bs() as usize);
                if (one.len() as u64) < self.bs() {
                    return Err(Sense::param_list_length());
                }
                one.iter()
                    .copied()
                    .cycle()
                    .take(len as usize)
                    .collect::<Vec<u8>>()
            }
            _ => {
                let all = gather(req.data_out, len as usize);
                if (all.len() as u64) < len {
                    return Err(Sense::param_list_length());
                }
                all
            }
        };
        let mut have = vec![0u8; len as usize];
        self.cfg
            .device
            .read_at(&mut have, r.lba * self.bs())
            .map_err(|e| Sense::device(&e, Sense::read_error()))?;
        if let Some(i) = have.iter().zip(&expect).position(|(a, b)| a != b) {
            return Err(Sense::miscompare(i as u64));
        }
        Ok(())
    }

    /// WRITE SAME's checks: where, how much, and with what.
    pub(crate) fn write_same_plan(
        &self,
        req: &ScsiRequest<'_>,
        lba: u64,
        blocks: u32,
        unmap: bool,
        anchor: bool,
        ndob: bool,
    ) -> Result<WriteSamePlan, Sense> {
        self.check_writable()?;
        if anchor || (unmap && !self.cfg.thin) {
            return Err(Sense::invalid_cdb(1, Some(if anchor { 4 } else { 3 })));
        }
        // WSNZ=1: zero blocks is an error rather than "to the end of the medium".
        if blocks == 0 {
            return Err(Sense::invalid_cdb(if ndob { 10 } else { 7 }, None));
        }
        if u64::from(blocks) > MAX_WRITE_SAME_BLOCKS {
            return Err(Sense::invalid_cdb(7, None));
        }
        self.check_range(lba, u64::from(blocks))?;
        let bs = self.bs() as usize;
        let block = if ndob {
            vec![0u8; bs]
        } else {
            let b = gather(req.data_out, bs);
            if b.len() < bs {
                return Err(Sense::param_list_length());
            }
            b
        };
        let discard = unmap && block.iter().all(|&b| b == 0);
        Ok(WriteSamePlan {
            lba,
            blocks: u64::from(blocks),
            block,
            discard,
        })
    }

    pub(crate) fn write_same(
        &self,
        req: &ScsiRequest<'_>,
        lba: u64,
        blocks: u32,
        unmap: bool,
        anchor: bool,
        ndob: bool,
    ) -> Result<(), Sense> {
        let plan = self.write_same_plan(req, lba, blocks, unmap, anchor, ndob)?;
        let bs = self.bs() as usize;
        let offset = lba * self.bs();
        let len = plan.blocks * self.bs();
        let _guard = self.caw.write(lba, lba + plan.blocks);
        let block = plan.block;
        if plan.discard {
            self.cfg
                .device
                .punch_hole(offset, len)
                .map_err(|e| Sense::device(&e, Sense::write_error()))?;
        } else if let Some(done) = self.cfg.device.write_same(offset, len, &block) {
            done.map_err(|e| Sense::device(&e, Sense::write_error()))?;
        } else {
            let per = (1usize << 20) / bs;
            let chunk: Vec<u8> = block.iter().copied().cycle().take(per * bs).collect();
            let mut at = 0u64;
            while at < len {
                let n = (len - at).min(chunk.len() as u64) as usize;
                self.cfg
                    .device
                    .write_at(chunk.get(..n).unwrap_or_default(), offset + at)
                    .map_err(|e| Sense::device(&e, Sense::write_error()))?;
                at += n as u64;
            }
        }
        self.complete_write(false)
    }

    /// UNMAP's checks: the (lba, blocks) ranges to deallocate, none empty.
    pub(crate) fn unmap_plan(
        &self,
        req: &ScsiRequest<'_>,
        anchor: bool,
        param_len: u32,
    ) -> Result<Vec<(u64, u64)>, Sense> {
        if !self.cfg.thin {
            return Err(Sense::invalid_opcode());
        }
        self.check_writable()?;
        if anchor {
            return Err(Sense::invalid_cdb(1, Some(0)));
        }
        if param_len == 0 {
            return Ok(Vec::new());
        }
        if param_len < 8 {
            return Err(Sense::param_list_length());
        }
        let data = gather(req.data_out, param_len as usize);
        if data.len() < 8 {
            return Err(Sense::param_list_length());
        }
        let be16 = |at: usize| {
            u16::from_be_bytes([
                data.get(at).copied().unwrap_or(0),
                data.get(at + 1).copied().unwrap_or(0),
            ])
        };
        let bd_len = usize::from(be16(2));
        let usable = bd_len.min(data.len() - 8) / 16;
        if usable as u32 > MAX_UNMAP_DESCRIPTORS {
            return Err(Sense::invalid_param(2, None));
        }
        let mut ranges = Vec::with_capacity(usable);
        let mut total = 0u64;
        for i in 0..usable {
            let at = 8 + i * 16;
            let d = data.get(at..at + 16).unwrap_or_default();
            let lba = d
                .get(..8)
                .map_or(0, |x| x.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b)));
            let n = d
                .get(8..12)
                .map_or(0, |x| x.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b)));
            self.check_range(lba, n)?;
            total += n;
            if total > u64::from(MAX_UNMAP_BLOCKS) {
                return Err(Sense::invalid_param(at + 8, None));
            }
            if n > 0 {
                ranges.push((lba, n));
            }
        }
        Ok(ranges)
    }

    pub(crate) fn unmap(
        &self,
        req: &ScsiRequest<'_>,
        anchor: bool,
        param_len: u32,
    ) -> Result<(), Sense> {
        for (lba, n) in self.unmap_plan(req, anchor, param_len)? {
            let _guard = self.caw.write(lba, lba + n);
            self.cfg
                .device
                .punch_hole(lba * self.bs(), n * self.bs())
                .map_err(|e| Sense::device(&e, Sense::write_error()))?;
        }
        Ok(())
    }

    /// COMPARE AND WRITE's checks: the verify data then the write data (`None` for zero
    /// blocks, which does nothing and succeeds).
    pub(crate) fn compare_and_write_plan(
        &self,
        req: &ScsiRequest<'_>,
        r: &BlockRange,
    ) -> Result<Option<Vec<u8>>, Sense> {
        self.check_writable()?;
        if r.blocks > self.max_caw_blocks() {
            return Err(Sense::invalid_cdb(13, None));
        }
        self.check_range(r.lba, u64::from(r.blocks))?;
        if r.blocks == 0 {
            // Zero blocks transfers nothing; data-out with it means the CDB is wrong (e.g. a
            // 256-block request that wrapped the one-byte field).
            if req.data_out.iter().any(|b| !b.is_empty()) {
                return Err(Sense::invalid_cdb(13, None));
            }
            return Ok(None);
        }
        let len = u64::from(r.blocks) * self.bs();
        let data = gather(req.data_out, (2 * len) as usize);
        if (data.len() as u64) < 2 * len {
            return Err(Sense::param_list_length());
        }
        Ok(Some(data))
    }

    pub(crate) fn compare_and_write(
        &self,
        req: &ScsiRequest<'_>,
        r: BlockRange,
    ) -> Result<(), Sense> {
        let Some(data) = self.compare_and_write_plan(req, &r)? else {
            return Ok(());
        };
        let len = u64::from(r.blocks) * self.bs();
        let (verify, write) = data.split_at(len as usize);
        let end = r.lba + u64::from(r.blocks);
        let _guard = self.caw.compare_and_write(r.lba, end);
        // Storage shared by several gateways compares and writes itself, atomically for all.
        if let Some(done) = self
            .cfg
            .device
            .compare_and_write(verify, write, r.lba * self.bs())
        {
            // NotConnected (a replicated LUN that cannot serve, or lost its peer with the
            // outcome unknown) is NOT READY, which the host retries.
            return match done.map_err(|e| Sense::device(&e, Sense::write_error()))? {
                Some(i) => Err(Sense::miscompare(i)),
                None => {
                    drop(_guard);
                    self.complete_write(r.fua)
                }
            };
        }
        let mut have = vec![0u8; len as usize];
        self.cfg
            .device
            .read_at(&mut have, r.lba * self.bs())
            .map_err(|e| Sense::device(&e, Sense::read_error()))?;
        if let Some(i) = have.iter().zip(verify).position(|(a, b)| a != b) {
            return Err(Sense::miscompare(i as u64));
        }
        self.cfg
            .device
            .write_at(write, r.lba * self.bs())
            .map_err(|e| Sense::device(&e, Sense::write_error()))?;
        drop(_guard);
        self.complete_write(r.fua)
    }

    pub(crate) fn get_lba_status(
        &self,
        lba: u64,
        alloc: u32,
        out: &mut BytesMut,
    ) -> Result<(), Sense> {
        if lba >= self.block_count() {
            return Err(Sense::lba_out_of_range());
        }
        let bs = self.bs();
        // Bound the work: look at most this far and return at most what fits in `alloc`.
        let max_desc = (alloc.saturating_sub(8) / 16).clamp(1, 1024) as usize;
        let span = (self.block_count() - lba).min((1 << 30) / bs);
        let map = self
            .cfg
            .device
            .allocation_map(lba * bs, span * bs)
            .map_err(|e| Sense::device(&e, Sense::read_error()))?;
        let mut descs: Vec<(u64, u64, u8)> = Vec::new();
        let mut push = |start: u64, end: u64, st: u8| {
            let start = start.max(descs.last().map_or(0, |l| l.0 + l.1));
            if end <= start {
                return;
            }
            if let Some(last) = descs.last_mut() {
                if last.2 == st && last.0 + last.1 == start {
                    last.1 += end - start;
                    return;
                }
            }
            descs.push((start, end - start, st));
        };
        for e in map {
            let (s, t) = (e.offset, e.offset + e.len);
            if e.allocated {
                push(s / bs, t.div_ceil(bs), 0);
            } else {
                // Only whole blocks inside a hole are deallocated.
                let (hs, ht) = (s.div_ceil(bs), t / bs);
                if hs < ht {
                    push(s / bs, hs, 0);
                    push(hs, ht, 1);
                    push(ht, t.div_ceil(bs), 0);
                } else {
                    push(s / bs, t.div_ceil(bs), 0);
                }
            }
        }
        descs.truncate(max_desc);
        let mut b = Vec::with_capacity(8 + 16 * descs.len());
        b.extend_from_slice(&((4 + 16 * descs.len()) as u32).to_be_bytes());
        b.extend_from_slice(&[0; 4]);
        for (start, n, st) in descs {
            b.extend_from_slice(&start.to_be_bytes());
            b.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
            b.extend_from_slice(&[st, 0, 0, 0]);
        }
        put_truncated(out, &b, alloc);
        Ok(())
    }
}

/// What a checked WRITE SAME does: `blocks` blocks from `lba`, each `block`, or deallocated
/// when `discard` (UNMAP set and a block of zeros).
pub(crate) struct WriteSamePlan {
    pub lba: u64,
    pub blocks: u64,
    pub block: Vec<u8>,
    pub discard: bool,
}
