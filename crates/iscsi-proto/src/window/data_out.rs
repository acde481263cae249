//! `DataOutTracker`: the Data-Out side of one write task. Validates immediate, unsolicited and
//! solicited data (RFC 7143 3.2.4.3, 11.7, 11.8, 13.13-13.17) and plans the R2Ts to send.

use crate::pdu::{reject_reason, DataOut, RESERVED_TAG};

/// The negotiated parameters and command fields that shape one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteParams {
    /// Expected Data Transfer Length of the command.
    pub expected_data_length: u32,
    /// Bytes of immediate data in the SCSI Command PDU.
    pub immediate_length: u32,
    /// The command's F bit was 0: unsolicited Data-Out PDUs follow.
    pub unsolicited_follows: bool,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    pub max_outstanding_r2t: u16,
    /// Our MaxRecvDataSegmentLength: the largest Data-Out we accept.
    pub max_recv_data_segment_length: u32,
}

/// One R2T to send (RFC 7143 11.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2tRequest {
    pub ttt: u32,
    pub r2t_sn: u32,
    pub offset: u32,
    pub length: u32,
}

/// A Data-Out (or the command's immediate data) the task cannot accept. At ErrorRecoveryLevel
/// 0 the driver answers with a Reject of [`reject_reason`](Self::reject_reason) and, for
/// sequence errors, fails the task with a CHECK CONDITION or drops the connection (RFC 7143 7.x).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataOutError {
    /// RFC 7143 13.13/13.14: immediate data beyond FirstBurstLength, EDTL or MRDSL, or sent
    /// when ImmediateData=No.
    #[error("{len} bytes of immediate data not allowed")]
    ImmediateData { len: u32 },
    /// Unsolicited data when InitialR2T=Yes, after the command's F bit, or after the
    /// unsolicited burst ended.
    #[error("unsolicited Data-Out not allowed")]
    UnsolicitedNotAllowed,
    #[error("Data-Out with unknown target transfer tag {0:#x}")]
    UnknownTransferTag(u32),
    /// RFC 7143 11.7.5: DataSN counts from 0 within each burst.
    #[error("DataSN {got}, expected {expected}")]
    DataSn { expected: u32, got: u32 },
    #[error("data at {offset}+{len} outside the requested range")]
    OutsideRange { offset: u32, len: u32 },
    #[error("data at {offset}+{len} overlaps data already received")]
    Overlap { offset: u32, len: u32 },
    #[error("Data-Out of {len} bytes exceeds MaxRecvDataSegmentLength")]
    TooLong { len: u32 },
    /// The F bit came before the burst's data was complete.
    #[error("F bit before the end of the burst")]
    EarlyFinal,
}

impl DataOutError {
    /// The Reject reason for the offending PDU (RFC 7143 11.17.1).
    pub fn reject_reason(&self) -> u8 {
        match self {
            DataOutError::UnknownTransferTag(_) => reject_reason::INVALID_PDU_FIELD,
            _ => reject_reason::PROTOCOL_ERROR,
        }
    }
}

/// What a valid Data-Out contributed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataOutProgress {
    /// Where the PDU's data goes in the task's buffer.
    pub offset: u32,
    /// The burst this PDU belonged to is complete (an R2T slot is free again).
    pub burst_done: bool,
    /// Every byte of the transfer is in.
    pub all_done: bool,
}

#[derive(Debug, Clone, Copy)]
struct Burst {
    ttt: u32,
    start: u32,
    end: u32,
    next_data_sn: u32,
    received: u32,
}

/// Data-Out bookkeeping of one write task. Bounded: at most MaxOutstandingR2T bursts are open,
/// and received ranges are merged as they arrive.
#[derive(Debug, Clone)]
pub struct DataOutTracker {
    params: WriteParams,
    /// The open unsolicited burst (TTT 0xffffffff), from the immediate data's end.
    unsolicited: Option<Burst>,
    solicited: Vec<Burst>,
    /// Ranges not yet received nor requested, in offset order.
    unrequested: Vec<(u32, u32)>,
    /// Received ranges, merged, in offset order.
    received: Vec<(u32, u32)>,
    next_r2t_sn: u32,
}

impl DataOutTracker {
    /// Starts tracking a write whose command carried `params.immediate_length` bytes.
    pub fn new(params: WriteParams) -> Result<Self, DataOutError> {
        let edtl = params.expected_data_length;
        let imm = params.immediate_length;
        if imm > 0
            && (!params.immediate_data
                || imm > edtl
                || imm > params.first_burst_length
                || imm > params.max_recv_data_segment_length)
        {
            return Err(DataOutError::ImmediateData { len: imm });
        }
        // RFC 7143 13.10/13.14: with InitialR2T=No the initiator may send unsolicited data up
        // to FirstBurstLength (immediate data included) unless the command's F bit is set.
        let unsolicited_end = if !params.initial_r2t && params.unsolicited_follows {
            edtl.min(params.first_burst_length.max(imm))
        } else {
            imm
        };
        let unsolicited = (unsolicited_end > imm).then_some(Burst {
            ttt: RESERVED_TAG,
            start: imm,
            end: unsolicited_end,
            next_data_sn: 0,
            received: 0,
        });
        let mut tracker = DataOutTracker {
            params,
            unsolicited,
            solicited: Vec::new(),
            unrequested: Vec::new(),
            received: Vec::new(),
            next_r2t_sn: 0,
        };
        if imm > 0 {
            tracker.received.push((0, imm));
        }
        if unsolicited_end < edtl {
            tracker.unrequested.push((unsolicited_end, edtl));
        }
        Ok(tracker)
    }

    /// Bytes received so far (immediate data included).
    pub fn received_bytes(&self) -> u64 {
        self.received.iter().map(|(a, b)| u64::from(b - a)).sum()
    }

    /// True once all EDTL bytes are in.
    pub fn is_complete(&self) -> bool {
        self.received_bytes() == u64::from(self.params.expected_data_length)
    }

    /// Appends to `out` the R2Ts to send now: up to MaxOutstandingR2T open bursts, each at most
    /// MaxBurstLength (RFC 7143 13.15, 13.17). `alloc_ttt` hands out target transfer tags.
    pub fn next_r2ts(&mut self, mut alloc_ttt: impl FnMut() -> u32, out: &mut Vec<R2tRequest>) {
        let max_open = usize::from(self.params.max_outstanding_r2t.max(1));
        let max_burst = self.params.max_burst_length.max(1);
        while self.solicited.len() < max_open {
            let Some(first) = self.unrequested.first_mut() else {
                break;
            };
            let start = first.0;
            let end = first.1.min(start.saturating_add(max_burst));
            first.0 = end;
            if first.0 >= first.1 {
                self.unrequested.remove(0);
            }
            let ttt = alloc_ttt();
            let r2t = R2tRequest {
                ttt,
                r2t_sn: self.next_r2t_sn,
                offset: start,
                length: end - start,
            };
            self.next_r2t_sn = self.next_r2t_sn.wrapping_add(1);
            self.solicited.push(Burst {
                ttt,
                start,
                end,
                next_data_sn: 0,
                received: 0,
            });
            out.push(r2t);
        }
    }

    /// R2Ts sent so far (ExpDataSN of the SCSI Response counts them, RFC 7143 11.4.6).
    pub fn r2t_count(&self) -> u32 {
        self.next_r2t_sn
    }

    /// Validates one Data-Out PDU for this task.
    pub fn on_data_out(&mut self, pdu: &DataOut) -> Result<DataOutProgress, DataOutError> {
        let len =
            u32::try_from(pdu.data.len()).map_err(|_| DataOutError::TooLong { len: u32::MAX })?;
        if len > self.params.max_recv_data_segment_length {
            return Err(DataOutError::TooLong { len });
        }
        let offset = pdu.buffer_offset;
        let end = offset
            .checked_add(len)
            .ok_or(DataOutError::OutsideRange { offset, len })?;
        let burst = if pdu.ttt == RESERVED_TAG {
            self.unsolicited
                .as_mut()
                .ok_or(DataOutError::UnsolicitedNotAllowed)?
        } else {
            self.solicited
                .iter_mut()
                .find(|b| b.ttt == pdu.ttt)
                .ok_or(DataOutError::UnknownTransferTag(pdu.ttt))?
        };
        if pdu.data_sn != burst.next_data_sn {
            return Err(DataOutError::DataSn {
                expected: burst.next_data_sn,
                got: pdu.data_sn,
            });
        }
        if offset < burst.start || end > burst.end {
            return Err(DataOutError::OutsideRange { offset, len });
        }
        if self.received.iter().any(|&(a, b)| offset < b && a < end) {
            return Err(DataOutError::Overlap { offset, len });
        }
        burst.next_data_sn = burst.next_data_sn.wrapping_add(1);
        burst.received += len;
        let filled = burst.received == burst.end - burst.start;
        let (ttt, start, burst_end, received) = (burst.ttt, burst.start, burst.end, burst.received);
        let burst_done = if ttt == RESERVED_TAG {
            // The unsolicited burst may end early (F=1): the rest is then solicited by R2T.
            if pdu.final_bit || filled {
                self.unsolicited = None;
                let stop = start + received;
                if stop < burst_end {
                    self.unrequested.insert(0, (stop, burst_end));
                }
                true
            } else {
                false
            }
        } else {
            // RFC 7143 11.7.1: F marks the last PDU of the sequence an R2T asked for.
            if pdu.final_bit && !filled {
                return Err(DataOutError::EarlyFinal);
            }
            if filled {
                self.solicited.retain(|b| b.ttt != ttt);
            }
            filled
        };
        self.insert_received(offset, end);
        Ok(DataOutProgress {
            offset,
            burst_done,
            all_done: self.is_complete(),
        })
    }

    /// Records `start..end` as received, merging with its neighbours in place so an in-order
    /// transfer keeps a single range and no Data-Out allocates.
    fn insert_received(&mut self, start: u32, end: u32) {
        if start == end {
            return;
        }
        let at = self.received.partition_point(|&(a, _)| a < start);
        let joins_prev = at > 0 && self.received.get(at - 1).is_some_and(|p| p.1 == start);
        let joins_next = self.received.get(at).is_some_and(|n| n.0 == end);
        match (joins_prev, joins_next) {
            (true, true) => {
                let next_end = self.received.get(at).map_or(end, |n| n.1);
                if let Some(prev) = self.received.get_mut(at - 1) {
                    prev.1 = next_end;
                }
                self.received.remove(at);
            }
            (true, false) => {
                if let Some(prev) = self.received.get_mut(at - 1) {
                    prev.1 = end;
                }
            }
            (false, true) => {
                if let Some(next) = self.received.get_mut(at) {
                    next.0 = start;
                }
            }
            (false, false) => self.received.insert(at, (start, end)),
        }
    }
}

#[cfg(test)]
#[path = "data_out_tests.rs"]
mod tests;
