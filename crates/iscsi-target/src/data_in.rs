//! Data-In layout: a command's data-in cut into Data-In PDUs on the connection's grid, with
//! the status in the last one (phase collapse, RFC 7143 11.7.4) or in a SCSI Response. A READ
//! read in pieces sends its first pieces ahead ([`DataInPart`]) and ends with the rest; every
//! piece lies on the same grid, so DataSN and the F bits come out as if it had gone in one.

use bytes::{Bytes, BytesMut};
use iscsi_proto::pdu::{DataIn, Pdu, ScsiResponse, RESERVED_TAG};

/// The result of one SCSI command, to be sent as Data-In PDUs and/or a SCSI Response.
pub struct ScsiDone {
    pub itt: u32,
    pub lun: u64,
    pub status: u8,
    /// Sense bytes (fixed or descriptor format), without the SenseLength prefix.
    pub sense: Option<Bytes>,
    /// Data-In payload as produced by the logical unit (may exceed `edtl`), from byte
    /// `data_offset` on: what came before went out as [`DataInPart`]s.
    pub data_in: Bytes,
    pub data_offset: u32,
    /// Expected Data Transfer Length of the command.
    pub edtl: u32,
    pub read: bool,
    pub write: bool,
    /// Bytes of data-out the CDB called for (for write residuals).
    pub write_expected: Option<u32>,
    /// Bytes of data-out the initiator actually sent.
    pub write_received: u32,
    /// R2Ts sent for this command (ExpDataSN counts them, RFC 7143 11.4.6).
    pub r2t_count: u32,
}

/// A piece of a READ's data-in, ahead of its status.
pub struct DataInPart {
    pub itt: u32,
    pub lun: u64,
    pub offset: u32,
    pub data: Bytes,
}

/// The Data-In grid of a connection: PDUs of at most `seg` bytes, each sequence of `burst`
/// bytes cut from its start (the F bit at its end). Every command's Data-In is laid on it, so
/// where a PDU starts is known without state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub seg: usize,
    pub burst: usize,
}

impl Grid {
    /// From the initiator's MaxRecvDataSegmentLength and the session's MaxBurstLength.
    pub fn new(max_xmit: u32, max_burst: u32) -> Grid {
        Grid {
            seg: max_xmit.max(512) as usize,
            burst: max_burst.max(max_xmit).max(512) as usize,
        }
    }

    /// DataSN of the PDU that starts at `offset` (a PDU boundary).
    fn data_sn(&self, offset: usize) -> u32 {
        let whole = (offset / self.burst) * self.burst.div_ceil(self.seg);
        (whole + (offset % self.burst) / self.seg) as u32
    }
}

/// Bytes per piece for READs handed on as they are read: about `TARGET` bytes, a multiple of
/// whatever keeps every piece boundary a Data-In PDU boundary of `grid`. 512 KiB cuts a 1 MiB
/// READ in two; four pieces of 256 KiB measured slower than none (each piece costs the OSDs
/// about what a whole READ does: bench/rbd-gateway, docs/BENCHMARKS.md).
pub fn read_piece(grid: Grid) -> usize {
    const TARGET: usize = 512 * 1024;
    let unit = if grid.burst.is_multiple_of(grid.seg) {
        grid.seg
    } else {
        grid.burst
    };
    unit * (TARGET / unit).max(1)
}

impl Grid {
    /// Data-In PDUs for `data` at byte `from` of a command's data-in, on the grid; the PDU
    /// ending at `total` carries `status` when given. Returns the next DataSN.
    fn lay_data(
        self,
        (itt, lun): (u32, u64),
        data: &Bytes,
        from: usize,
        closes: bool,
        status: Option<(u8, bool, bool, u32)>,
        out: &mut Vec<Pdu>,
    ) -> u32 {
        let grid = self;
        let end = from + data.len();
        let mut offset = from;
        let mut data_sn = grid.data_sn(from);
        while offset < end {
            let burst_end = ((offset / grid.burst) + 1) * grid.burst;
            let len = grid.seg.min(end - offset).min(burst_end - offset);
            let last = offset + len == end;
            let here = status.filter(|_| last);
            out.push(Pdu::DataIn(DataIn {
                final_bit: (last && closes) || offset + len == burst_end,
                status_present: here.is_some(),
                status: here.map_or(0, |h| h.0),
                overflow: here.is_some_and(|h| h.1),
                underflow: here.is_some_and(|h| h.2),
                residual: here.map_or(0, |h| h.3),
                lun: if here.is_some() { 0 } else { lun },
                itt,
                ttt: RESERVED_TAG,
                data_sn,
                buffer_offset: offset as u32,
                data: data.slice(offset - from..offset - from + len),
                ..DataIn::default()
            }));
            offset += len;
            data_sn = data_sn.wrapping_add(1);
        }
        data_sn
    }

    /// A READ's piece sent ahead of its status.
    pub fn lay_out_part(self, part: DataInPart, out: &mut Vec<Pdu>, sent: &mut Vec<Bytes>) {
        self.lay_data(
            (part.itt, part.lun),
            &part.data,
            part.offset as usize,
            false,
            None,
            out,
        );
        sent.push(part.data);
    }

    /// Turns a completed command into Data-In PDUs (the last one carrying status when there is
    /// no sense: phase collapse, RFC 7143 11.7.4) and, if needed, a SCSI Response.
    pub fn lay_out(self, done: ScsiDone, out: &mut Vec<Pdu>, sent: &mut Vec<Bytes>) {
        let mut data = done.data_in;
        let (mut overflow, mut underflow, mut residual) = (false, false, 0u32);
        let base = if done.read {
            done.data_offset as usize
        } else {
            0
        };
        if done.read {
            let produced = u32::try_from(base + data.len()).unwrap_or(u32::MAX);
            if produced > done.edtl {
                overflow = true;
                residual = produced - done.edtl;
                data.truncate((done.edtl as usize).saturating_sub(base));
            } else if produced < done.edtl {
                underflow = true;
                residual = done.edtl - produced;
            }
        } else if done.write {
            let wanted = done.write_expected.unwrap_or(done.write_received);
            if wanted > done.edtl {
                overflow = true;
                residual = wanted - done.edtl;
            } else if wanted < done.edtl {
                underflow = true;
                residual = done.edtl - wanted;
            }
        } else if done.edtl > 0 {
            // No data phase expected by the CDB but the initiator announced some.
            let wanted = done.write_expected.unwrap_or(0);
            if wanted < done.edtl {
                underflow = true;
                residual = done.edtl - wanted;
            }
        }
        if !done.read {
            data.clear();
        }
        let collapse = done.sense.is_none() && !data.is_empty();
        let status = collapse.then_some((done.status, overflow, underflow, residual));
        let data_sn = self.lay_data((done.itt, done.lun), &data, base, true, status, out);
        if !data.is_empty() {
            sent.push(data);
        }
        if collapse {
            return;
        }
        let sense = match done.sense {
            Some(s) => {
                let mut b = BytesMut::with_capacity(2 + s.len());
                b.extend_from_slice(&(s.len() as u16).to_be_bytes());
                b.extend_from_slice(&s);
                b.freeze()
            }
            None => Bytes::new(),
        };
        out.push(Pdu::ScsiResponse(ScsiResponse {
            overflow,
            underflow,
            residual,
            response: 0,
            status: done.status,
            itt: done.itt,
            exp_data_sn: data_sn.wrapping_add(done.r2t_count),
            data: sense,
            ..ScsiResponse::default()
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EDTL: u32 = 1 << 20;

    fn read_done(data: Bytes, data_offset: u32, sense: Option<Bytes>) -> ScsiDone {
        ScsiDone {
            itt: 7,
            lun: 1 << 48,
            status: if sense.is_some() { 2 } else { 0 },
            sense,
            data_in: data,
            data_offset,
            edtl: EDTL,
            read: true,
            write: false,
            write_expected: None,
            write_received: 0,
            r2t_count: 0,
        }
    }

    fn pattern() -> Bytes {
        (0..EDTL)
            .map(|i| (i % 253) as u8)
            .collect::<Vec<u8>>()
            .into()
    }

    /// The same READ laid out in one go and in pieces ahead of the rest.
    fn both_ways(grid: Grid) -> (Vec<Pdu>, Vec<Pdu>) {
        let data = pattern();
        let (mut whole, mut sent) = (Vec::new(), Vec::new());
        grid.lay_out(read_done(data.clone(), 0, None), &mut whole, &mut sent);
        let piece = read_piece(grid);
        let mut parts = Vec::new();
        let mut at = 0;
        while data.len() - at > piece {
            let part = DataInPart {
                itt: 7,
                lun: 1 << 48,
                offset: at as u32,
                data: data.slice(at..at + piece),
            };
            grid.lay_out_part(part, &mut parts, &mut sent);
            at += piece;
        }
        assert!(at > 0, "{grid:?}: more than one piece");
        let rest = read_done(data.slice(at..), at as u32, None);
        grid.lay_out(rest, &mut parts, &mut sent);
        (whole, parts)
    }

    #[test]
    fn pieces_make_the_same_pdus_as_one_response() {
        for (seg, burst) in [
            (8192, 262_144),
            (262_144, 262_144),
            (65_536, 1 << 20),
            (24_576, 100_000),
            (512, 16 << 20),
        ] {
            let grid = Grid::new(seg, burst);
            let (whole, parts) = both_ways(grid);
            assert_eq!(whole, parts, "{grid:?}");
            // And the grid's numbering is the layout's: DataSN counts PDUs from 0.
            for (n, pdu) in parts.iter().enumerate() {
                let Pdu::DataIn(d) = pdu else {
                    panic!("{pdu:?}")
                };
                assert_eq!(d.data_sn, n as u32, "{grid:?}");
                assert_eq!(grid.data_sn(d.buffer_offset as usize), n as u32);
            }
        }
    }

    #[test]
    fn a_failure_after_pieces_reports_what_was_not_sent() {
        let grid = Grid::new(8192, 262_144);
        let (mut out, mut sent) = (Vec::new(), Vec::new());
        let data = pattern();
        let part = DataInPart {
            itt: 7,
            lun: 1 << 48,
            offset: 0,
            data: data.slice(..262_144),
        };
        grid.lay_out_part(part, &mut out, &mut sent);
        assert_eq!(out.len(), 32);
        let sense = Bytes::from_static(&[0x70, 0, 3, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x11, 0]);
        grid.lay_out(
            read_done(Bytes::new(), 262_144, Some(sense)),
            &mut out,
            &mut sent,
        );
        let Some(Pdu::ScsiResponse(r)) = out.last() else {
            panic!("{:?}", out.last())
        };
        assert_eq!(r.status, 2);
        assert!(r.underflow && !r.overflow);
        assert_eq!(r.residual, EDTL - 262_144);
        assert_eq!(r.exp_data_sn, 32, "the Data-In PDUs sent");
        let Pdu::DataIn(last) = &out[31] else {
            panic!()
        };
        assert!(last.final_bit && !last.status_present, "a burst's end");
    }

    #[test]
    fn pieces_lie_on_pdu_boundaries() {
        for (seg, burst) in [(8192, 262_144), (24_576, 100_000), (262_144, 1 << 24)] {
            let grid = Grid::new(seg, burst);
            let piece = read_piece(grid);
            assert!(piece >= seg as usize);
            for k in 1..8 {
                let o = k * piece;
                assert_eq!((o % grid.burst) % grid.seg, 0, "{grid:?} piece {piece}");
            }
        }
    }
}
