//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS (SPC-4 6.3, 6.22): block-to-block copies
//! between logical units of this target named by their NAA designator.

use crate::lun::LogicalUnit;
use crate::sense::{key, Sense};
use crate::{gather, put_truncated, ScsiRequest};
use bytes::BytesMut;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

const MAX_CSCD: u16 = 2;
const MAX_SEGMENTS: u16 = 8;
const MAX_DESC_LIST: u32 = 1024;
const MAX_SEGMENT_BYTES: u32 = 64 << 20;
const HEADER: usize = 16;
const CSCD_LEN: usize = 32;

/// Outcome of one finished copy: success, segments processed, bytes copied.
type CopyResult = (bool, u16, u64);

/// Results of finished copies, by (nexus, list identifier) (for COPY STATUS).
#[derive(Default)]
pub(crate) struct CopyManager {
    results: Mutex<HashMap<(u64, u8), CopyResult>>,
}

fn copy_aborted(asc: u8, ascq: u8) -> Sense {
    Sense::new(key::COPY_ABORTED, asc, ascq)
}

fn be(d: &[u8], at: usize, n: usize) -> u64 {
    d.get(at..at + n)
        .map_or(0, |x| x.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b)))
}

impl LogicalUnit {
    /// The LU (this one or a peer) whose NAA designator is `naa`.
    fn lu_by_naa(self: &LogicalUnit, naa: &[u8]) -> Option<Arc<LogicalUnit>> {
        self.peers
            .read()
            .iter()
            .filter_map(|w| w.upgrade())
            .find(|lu| lu.cfg.naa_id.as_slice() == naa)
    }

    pub(crate) fn extended_copy(&self, req: &ScsiRequest<'_>, param_len: u32) -> Result<(), Sense> {
        if param_len == 0 {
            return Ok(());
        }
        let d = gather(req.data_out, param_len as usize);
        if d.len() < param_len as usize || d.len() < HEADER {
            return Err(Sense::param_list_length());
        }
        let list_id = d.first().copied().unwrap_or(0);
        let usage = (d.get(1).copied().unwrap_or(0) >> 3) & 3;
        let cscd_len = be(&d, 2, 2) as usize;
        let seg_len = be(&d, 8, 4) as usize;
        let inline_len = be(&d, 12, 4) as usize;
        if HEADER + cscd_len + seg_len + inline_len > d.len() {
            return Err(Sense::param_list_length());
        }
        if (cscd_len + seg_len) as u64 > u64::from(MAX_DESC_LIST) {
            return Err(Sense::param_list_length());
        }
        if inline_len != 0 {
            return Err(Sense::invalid_param(12, None));
        }
        if cscd_len / CSCD_LEN * CSCD_LEN != cscd_len {
            return Err(Sense::param_list_length());
        }
        if cscd_len / CSCD_LEN > usize::from(MAX_CSCD) {
            return Err(Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x06));
        }
        // Target (CSCD) descriptors.
        let mut targets: Vec<Option<Arc<LogicalUnit>>> = Vec::new();
        for i in 0..cscd_len / CSCD_LEN {
            let at = HEADER + i * CSCD_LEN;
            let t = d.get(at..at + CSCD_LEN).unwrap_or_default();
            if t.first() != Some(&0xE4) {
                return Err(Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x07));
            }
            // Peripheral device type must be block (0); LU ID type and NUL are ignored (SPC-4).
            if t.get(1).is_some_and(|b| b & 0x1F != 0) {
                return Err(Sense::invalid_param(at + 1, Some(4)));
            }
            let desig_type = t.get(5).copied().unwrap_or(0) & 0x0F;
            let dlen = usize::from(t.get(7).copied().unwrap_or(0));
            let naa = t.get(8..8 + dlen.min(20)).unwrap_or_default();
            targets.push(if desig_type == 3 {
                self.lu_by_naa(naa)
            } else {
                None
            });
        }
        // Segment descriptors.
        let mut at = HEADER + cscd_len;
        let end = at + seg_len;
        let mut segments = Vec::new();
        while at < end {
            let s = d.get(at..end).unwrap_or_default();
            if segments.len() >= usize::from(MAX_SEGMENTS) {
                return Err(Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x08));
            }
            if s.first() != Some(&0x02) {
                return Err(Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x09));
            }
            let dlen = be(s, 2, 2) as usize + 4;
            if dlen != 28 || s.len() < dlen {
                return Err(Sense::param_list_length());
            }
            segments.push((
                be(s, 4, 2) as usize,
                be(s, 6, 2) as usize,
                s.get(1).is_some_and(|b| b & 0x02 != 0),
                be(s, 10, 2),
                be(s, 12, 8),
                be(s, 20, 8),
            ));
            at += dlen;
        }
        let mut done_segments = 0u16;
        let mut bytes = 0u64;
        let mut result = Ok(());
        for (src, dst, dc, blocks, src_lba, dst_lba) in segments {
            let (Some(Some(src)), Some(Some(dst))) = (targets.get(src), targets.get(dst)) else {
                result = Err(copy_aborted(0x0D, 0x02));
                break;
            };
            match copy_blocks(src, dst, dc, blocks, src_lba, dst_lba) {
                Ok(n) => bytes += n,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            done_segments += 1;
        }
        if usage != 3 {
            self.copy.results.lock().insert(
                (req.nexus.id, list_id),
                (result.is_ok(), done_segments, bytes),
            );
        }
        result
    }

    pub(crate) fn receive_copy_results(
        &self,
        nexus: u64,
        action: u8,
        list_id: u8,
        alloc: u32,
        out: &mut BytesMut,
    ) -> Result<(), Sense> {
        let mut b = Vec::new();
        match action {
            3 => {
                b.resize(44, 0);
                let codes = [0x02u8, 0xE4];
                let put = |b: &mut Vec<u8>, at: usize, v: &[u8]| {
                    if let Some(d) = b.get_mut(at..at + v.len()) {
                        d.copy_from_slice(v);
                    }
                };
                put(&mut b, 0, &((40 + codes.len()) as u32).to_be_bytes());
                put(&mut b, 8, &MAX_CSCD.to_be_bytes());
                put(&mut b, 10, &MAX_SEGMENTS.to_be_bytes());
                put(&mut b, 12, &MAX_DESC_LIST.to_be_bytes());
                put(&mut b, 16, &MAX_SEGMENT_BYTES.to_be_bytes());
                put(&mut b, 34, &1u16.to_be_bytes()); // total concurrent copies
                put(&mut b, 36, &[1, 9, 0, 0]); // max concurrent, 512-byte granularity
                put(&mut b, 43, &[codes.len() as u8]);
                b.extend_from_slice(&codes);
            }
            0 => {
                let r = self.copy.results.lock().remove(&(nexus, list_id));
                let Some((ok, segs, bytes)) = r else {
                    return Err(Sense::invalid_cdb(2, None));
                };
                b.extend_from_slice(&8u32.to_be_bytes());
                b.push(if ok { 0x01 } else { 0x02 });
                b.extend_from_slice(&segs.to_be_bytes());
                b.push(0x00); // transfer count in bytes
                b.extend_from_slice(&u32::try_from(bytes).unwrap_or(u32::MAX).to_be_bytes());
            }
            _ => return Err(Sense::invalid_cdb(1, Some(4))),
        }
        put_truncated(out, &b, alloc);
        Ok(())
    }
}

/// Copies one block-to-block segment; returns bytes copied.
fn copy_blocks(
    src: &LogicalUnit,
    dst: &LogicalUnit,
    dc: bool,
    blocks: u64,
    src_lba: u64,
    dst_lba: u64,
) -> Result<u64, Sense> {
    let sbs = u64::from(src.cfg.block_size);
    let dbs = u64::from(dst.cfg.block_size);
    let bytes = blocks * if dc { dbs } else { sbs };
    if bytes.checked_rem(sbs) != Some(0)
        || bytes.checked_rem(dbs) != Some(0)
        || bytes > u64::from(MAX_SEGMENT_BYTES)
    {
        return Err(copy_aborted(0x26, 0x0A));
    }
    if src.check_range(src_lba, bytes / sbs).is_err()
        || dst.check_range(dst_lba, bytes / dbs).is_err()
    {
        return Err(copy_aborted(0x00, 0x00));
    }
    if dst.cfg.read_only {
        return Err(Sense::write_protected());
    }
    let chunk = 1u64 << 20;
    let mut buf = vec![0u8; chunk.min(bytes) as usize];
    let mut done = 0u64;
    while done < bytes {
        let n = (bytes - done).min(chunk) as usize;
        let b = buf.get_mut(..n).unwrap_or_default();
        src.cfg
            .device
            .read_at(b, src_lba * sbs + done)
            .map_err(|_| copy_aborted(0x11, 0x00))?;
        let first = (dst_lba * dbs + done) / dbs;
        let _g = dst.caw.write(first, first + n as u64 / dbs);
        dst.cfg
            .device
            .write_at(b, dst_lba * dbs + done)
            .map_err(|_| copy_aborted(0x0C, 0x00))?;
        done += n as u64;
    }
    if !dst.wce.load(std::sync::atomic::Ordering::Relaxed) {
        dst.cfg
            .device
            .flush()
            .map_err(|_| copy_aborted(0x0C, 0x00))?;
    }
    Ok(bytes)
}
