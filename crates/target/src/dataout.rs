//! Collection of one write command's data: immediate data, the unsolicited burst, and the
//! solicited bursts we ask for with R2T (RFC 7143 3.2.4.2, 11.7, 11.8).
//!
//! Sessions negotiate DataPDUInOrder=Yes and DataSequenceInOrder=Yes, so data must arrive in
//! increasing offset order; anything else is a protocol error.

use bytes::Bytes;
use iscsi_proto::pdu::{DataOut, R2t, RESERVED_TAG};

/// Why a Data-Out was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataOutError {
    /// DataSN out of sequence (RFC 7143 7.x: protocol error at ERL 0).
    DataSn,
    /// Offset or length outside what was asked for or allowed.
    Offset,
    /// Target Transfer Tag names no outstanding R2T.
    UnknownTtt,
}

/// Limits negotiated for the session.
#[derive(Debug, Clone, Copy)]
pub struct BurstLimits {
    pub first_burst: u32,
    pub max_burst: u32,
    pub max_outstanding_r2t: u32,
    pub initial_r2t: bool,
}

struct Solicited {
    ttt: u32,
    offset: u32,
    end: u32,
    next_data_sn: u32,
}

/// One write command's data being collected.
pub struct WriteTransfer {
    pub itt: u32,
    pub lun: u64,
    pub edtl: u32,
    segments: Vec<Bytes>,
    received: u32,
    /// End of the unsolicited range (immediate + unsolicited Data-Out).
    unsolicited_end: u32,
    unsolicited_data_sn: u32,
    /// Next offset not yet covered by an R2T.
    next_r2t_offset: u32,
    next_r2t_sn: u32,
    outstanding: Vec<Solicited>,
    pub r2t_count: u32,
    limits: BurstLimits,
}

impl WriteTransfer {
    /// Starts a write whose command carried `immediate` data; `final_bit` is the command's F bit
    /// (no unsolicited Data-Out follows when set).
    pub fn new(itt: u32, lun: u64, edtl: u32, immediate: Bytes, final_bit: bool, limits: BurstLimits) -> Self {
        let imm = u32::try_from(immediate.len()).unwrap_or(u32::MAX).min(edtl);
        let unsolicited_end = if limits.initial_r2t || final_bit {
            imm
        } else {
            limits.first_burst.min(edtl).max(imm)
        };
        let mut segments = Vec::new();
        if imm > 0 {
            segments.push(immediate.slice(..imm as usize));
        }
        WriteTransfer {
            itt,
            lun,
            edtl,
            segments,
            received: imm,
            unsolicited_end,
            unsolicited_data_sn: 0,
            next_r2t_offset: unsolicited_end,
            next_r2t_sn: 0,
            outstanding: Vec::new(),
            r2t_count: 0,
            limits,
        }
    }

    /// All expected data is in.
    pub fn complete(&self) -> bool {
        self.received >= self.edtl
    }

    pub fn received(&self) -> u32 {
        self.received
    }

    /// The data-out segments, in offset order.
    pub fn take_segments(&mut self) -> Vec<Bytes> {
        std::mem::take(&mut self.segments)
    }

    /// R2Ts to send now, within MaxOutstandingR2T; `next_ttt` hands out Target Transfer Tags.
    pub fn r2ts(&mut self, mut next_ttt: impl FnMut() -> u32, out: &mut Vec<R2t>) {
        while self.next_r2t_offset < self.edtl
            && (self.outstanding.len() as u32) < self.limits.max_outstanding_r2t.max(1)
        {
            let offset = self.next_r2t_offset;
            let len = (self.edtl - offset).min(self.limits.max_burst.max(512));
            let ttt = next_ttt();
            self.outstanding.push(Solicited {
                ttt,
                offset,
                end: offset + len,
                next_data_sn: 0,
            });
            out.push(R2t {
                lun: self.lun,
                itt: self.itt,
                ttt,
                r2t_sn: self.next_r2t_sn,
                buffer_offset: offset,
                desired_length: len,
                ..R2t::default()
            });
            self.next_r2t_sn = self.next_r2t_sn.wrapping_add(1);
            self.next_r2t_offset = offset + len;
            self.r2t_count += 1;
        }
    }

    /// Accepts one Data-Out PDU.
    pub fn accept(&mut self, pdu: &DataOut) -> Result<(), DataOutError> {
        let len = u32::try_from(pdu.data.len()).map_err(|_| DataOutError::Offset)?;
        let end = pdu.buffer_offset.checked_add(len).ok_or(DataOutError::Offset)?;
        if pdu.buffer_offset != self.received {
            return Err(DataOutError::Offset);
        }
        if pdu.ttt == RESERVED_TAG {
            if pdu.data_sn != self.unsolicited_data_sn {
                return Err(DataOutError::DataSn);
            }
            if end > self.unsolicited_end {
                return Err(DataOutError::Offset);
            }
            self.unsolicited_data_sn = self.unsolicited_data_sn.wrapping_add(1);
        } else {
            let Some(pos) = self.outstanding.iter().position(|s| s.ttt == pdu.ttt) else {
                return Err(DataOutError::UnknownTtt);
            };
            let s = &mut self.outstanding[pos];
            if pdu.data_sn != s.next_data_sn {
                return Err(DataOutError::DataSn);
            }
            if pdu.buffer_offset < s.offset || end > s.end {
                return Err(DataOutError::Offset);
            }
            s.next_data_sn = s.next_data_sn.wrapping_add(1);
            if end == s.end || pdu.final_bit {
                self.outstanding.remove(pos);
            }
        }
        if len > 0 {
            self.segments.push(pdu.data.clone());
        }
        self.received = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(initial_r2t: bool) -> BurstLimits {
        BurstLimits {
            first_burst: 8192,
            max_burst: 16384,
            max_outstanding_r2t: 2,
            initial_r2t,
        }
    }

    fn data_out(ttt: u32, data_sn: u32, offset: u32, len: usize) -> DataOut {
        DataOut {
            ttt,
            data_sn,
            buffer_offset: offset,
            data: Bytes::from(vec![7u8; len]),
            ..DataOut::default()
        }
    }

    #[test]
    fn immediate_unsolicited_then_solicited() {
        let mut w = WriteTransfer::new(1, 0, 40960, Bytes::from(vec![1u8; 4096]), false, limits(false));
        let mut r2ts = Vec::new();
        let mut ttt = 100;
        w.r2ts(|| { ttt += 1; ttt }, &mut r2ts);
        assert_eq!(r2ts.len(), 2);
        assert_eq!(r2ts[0].buffer_offset, 8192);
        assert_eq!(r2ts[0].desired_length, 16384);
        assert_eq!(r2ts[1].buffer_offset, 24576);
        w.accept(&data_out(RESERVED_TAG, 0, 4096, 4096)).unwrap();
        assert_eq!(w.accept(&data_out(RESERVED_TAG, 1, 8192, 4096)), Err(DataOutError::Offset));
        w.accept(&data_out(101, 0, 8192, 16384)).unwrap();
        assert_eq!(w.accept(&data_out(102, 1, 24576, 16384)), Err(DataOutError::DataSn));
        w.accept(&data_out(102, 0, 24576, 16384)).unwrap();
        assert!(w.complete());
        assert_eq!(w.take_segments().iter().map(Bytes::len).sum::<usize>(), 40960);
    }

    #[test]
    fn unknown_ttt_is_refused() {
        let mut w = WriteTransfer::new(1, 0, 4096, Bytes::new(), true, limits(true));
        assert_eq!(w.accept(&data_out(5, 0, 0, 512)), Err(DataOutError::UnknownTtt));
        assert!(!w.complete());
    }
}
