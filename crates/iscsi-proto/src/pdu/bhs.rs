//! Basic Header Segment layouts (RFC 7143 11.2-11.19): one decode and one encode arm per PDU.

// Every index below is a constant offset inside the fixed 48-byte header array, checked by the
// round-trip tests; the header is never a slice of peer-controlled length.
#![allow(clippy::indexing_slicing)]

use super::*;
use bytes::{BufMut, BytesMut};

pub(crate) type Header = [u8; BHS_LEN];

fn u16_at(h: &Header, at: usize) -> u16 {
    let mut b = [0u8; 2];
    b.copy_from_slice(&h[at..at + 2]);
    u16::from_be_bytes(b)
}

fn u32_at(h: &Header, at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&h[at..at + 4]);
    u32::from_be_bytes(b)
}

fn u64_at(h: &Header, at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[at..at + 8]);
    u64::from_be_bytes(b)
}

fn put16(h: &mut Header, at: usize, v: u16) {
    h[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn put32(h: &mut Header, at: usize, v: u32) {
    h[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn put64(h: &mut Header, at: usize, v: u64) {
    h[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

fn bit(b: u8, mask: u8) -> bool {
    b & mask != 0
}

fn flag(on: bool, mask: u8) -> u8 {
    if on {
        mask
    } else {
        0
    }
}

/// Parses the AHS area of a SCSI Command (11.2.2): extended CDB (type 1) and bidi length (type 2).
fn scsi_command_ahs(ahs: &[u8]) -> Result<(Option<Bytes>, Option<u32>), &'static str> {
    let mut rest = ahs;
    let mut ext = None;
    let mut bidi = None;
    while !rest.is_empty() {
        let (len, kind) = match rest {
            [a, b, kind, _reserved, ..] => (usize::from(u16::from_be_bytes([*a, *b])), *kind),
            _ => return Err("truncated AHS"),
        };
        // AHSLength counts the specific field including its reserved first byte, excluding padding.
        let specific = rest.get(3..3 + len).ok_or("AHS length beyond header")?;
        let padded = (3 + len + 3) & !3;
        match kind {
            1 => {
                ext = Some(Bytes::copy_from_slice(
                    specific.get(1..).unwrap_or_default(),
                ))
            }
            2 => {
                let v: [u8; 4] = specific
                    .get(1..5)
                    .and_then(|v| v.try_into().ok())
                    .ok_or("short bidi AHS")?;
                bidi = Some(u32::from_be_bytes(v));
            }
            _ => return Err("unknown AHS type"),
        }
        rest = rest.get(padded..).unwrap_or_default();
    }
    Ok((ext, bidi))
}

/// Decodes a PDU whose header, AHS and data segment are complete and digest-checked.
pub(crate) fn decode(h: &Header, ahs: &[u8], data: Bytes) -> Result<Pdu, &'static str> {
    let immediate = bit(h[0], 0x40);
    let opcode = Opcode(h[0] & 0x3f);
    let b1 = h[1];
    let pdu = match opcode {
        Opcode::NOP_OUT => Pdu::NopOut(NopOut {
            immediate,
            lun: u64_at(h, 8),
            itt: u32_at(h, 16),
            ttt: u32_at(h, 20),
            cmd_sn: u32_at(h, 24),
            exp_stat_sn: u32_at(h, 28),
            data,
        }),
        Opcode::SCSI_COMMAND => {
            let (extended_cdb, bidi_read_length) = scsi_command_ahs(ahs)?;
            let mut cdb = [0u8; 16];
            cdb.copy_from_slice(&h[32..48]);
            Pdu::ScsiCommand(ScsiCommand {
                immediate,
                final_bit: bit(b1, 0x80),
                read: bit(b1, 0x40),
                write: bit(b1, 0x20),
                attr: b1 & 0x07,
                lun: u64_at(h, 8),
                itt: u32_at(h, 16),
                expected_data_length: u32_at(h, 20),
                cmd_sn: u32_at(h, 24),
                exp_stat_sn: u32_at(h, 28),
                cdb,
                extended_cdb,
                bidi_read_length,
                data,
            })
        }
        Opcode::TASK_MGMT_REQUEST => Pdu::TaskMgmtRequest(TaskMgmtRequest {
            immediate,
            function: b1 & 0x7f,
            lun: u64_at(h, 8),
            itt: u32_at(h, 16),
            referenced_task_tag: u32_at(h, 20),
            cmd_sn: u32_at(h, 24),
            exp_stat_sn: u32_at(h, 28),
            ref_cmd_sn: u32_at(h, 32),
            exp_data_sn: u32_at(h, 36),
        }),
        Opcode::LOGIN_REQUEST => {
            let mut isid = [0u8; 6];
            isid.copy_from_slice(&h[8..14]);
            Pdu::LoginRequest(LoginRequest {
                transit: bit(b1, 0x80),
                continue_bit: bit(b1, 0x40),
                csg: (b1 >> 2) & 3,
                nsg: b1 & 3,
                version_max: h[2],
                version_min: h[3],
                isid,
                tsih: u16_at(h, 14),
                itt: u32_at(h, 16),
                cid: u16_at(h, 20),
                cmd_sn: u32_at(h, 24),
                exp_stat_sn: u32_at(h, 28),
                data,
            })
        }
        Opcode::TEXT_REQUEST => Pdu::TextRequest(TextRequest {
            immediate,
            final_bit: bit(b1, 0x80),
            continue_bit: bit(b1, 0x40),
            lun: u64_at(h, 8),
            itt: u32_at(h, 16),
            ttt: u32_at(h, 20),
            cmd_sn: u32_at(h, 24),
            exp_stat_sn: u32_at(h, 28),
            data,
        }),
        Opcode::DATA_OUT => Pdu::DataOut(DataOut {
            final_bit: bit(b1, 0x80),
            lun: u64_at(h, 8),
            itt: u32_at(h, 16),
            ttt: u32_at(h, 20),
            exp_stat_sn: u32_at(h, 28),
            data_sn: u32_at(h, 36),
            buffer_offset: u32_at(h, 40),
            data,
        }),
        Opcode::LOGOUT_REQUEST => Pdu::LogoutRequest(LogoutRequest {
            immediate,
            reason: b1 & 0x7f,
            itt: u32_at(h, 16),
            cid: u16_at(h, 20),
            cmd_sn: u32_at(h, 24),
            exp_stat_sn: u32_at(h, 28),
        }),
        Opcode::SNACK_REQUEST => Pdu::SnackRequest(SnackRequest {
            snack_type: b1 & 0x0f,
            lun: u64_at(h, 8),
            itt: u32_at(h, 16),
            ttt: u32_at(h, 20),
            exp_stat_sn: u32_at(h, 28),
            beg_run: u32_at(h, 40),
            run_length: u32_at(h, 44),
        }),
        Opcode::NOP_IN => Pdu::NopIn(NopIn {
            lun: u64_at(h, 8),
            itt: u32_at(h, 16),
            ttt: u32_at(h, 20),
            stat_sn: u32_at(h, 24),
            exp_cmd_sn: u32_at(h, 28),
            max_cmd_sn: u32_at(h, 32),
            data,
        }),
        Opcode::SCSI_RESPONSE => Pdu::ScsiResponse(ScsiResponse {
            bidi_overflow: bit(b1, 0x10),
            bidi_underflow: bit(b1, 0x08),
            overflow: bit(b1, 0x04),
            underflow: bit(b1, 0x02),
            response: h[2],
            status: h[3],
            itt: u32_at(h, 16),
            snack_tag: u32_at(h, 20),
            stat_sn: u32_at(h, 24),
            exp_cmd_sn: u32_at(h, 28),
            max_cmd_sn: u32_at(h, 32),
            exp_data_sn: u32_at(h, 36),
            bidi_residual: u32_at(h, 40),
            residual: u32_at(h, 44),
            data,
        }),
        Opcode::TASK_MGMT_RESPONSE => Pdu::TaskMgmtResponse(TaskMgmtResponse {
            response: h[2],
            itt: u32_at(h, 16),
            stat_sn: u32_at(h, 24),
            exp_cmd_sn: u32_at(h, 28),
            max_cmd_sn: u32_at(h, 32),
        }),
        Opcode::LOGIN_RESPONSE => {
            let mut isid = [0u8; 6];
            isid.copy_from_slice(&h[8..14]);
            Pdu::LoginResponse(LoginResponse {
                transit: bit(b1, 0x80),
                continue_bit: bit(b1, 0x40),
                csg: (b1 >> 2) & 3,
                nsg: b1 & 3,
                version_max: h[2],
                version_active: h[3],
                isid,
                tsih: u16_at(h, 14),
                itt: u32_at(h, 16),
                stat_sn: u32_at(h, 24),
                exp_cmd_sn: u32_at(h, 28),
                max_cmd_sn: u32_at(h, 32),
                status_class: h[36],
                status_detail: h[37],
                data,
            })
        }
        Opcode::TEXT_RESPONSE => Pdu::TextResponse(TextResponse {
            final_bit: bit(b1, 0x80),
            continue_bit: bit(b1, 0x40),
            lun: u64_at(h, 8),
            itt: u32_at(h, 16),
            ttt: u32_at(h, 20),
            stat_sn: u32_at(h, 24),
            exp_cmd_sn: u32_at(h, 28),
            max_cmd_sn: u32_at(h, 32),
            data,
        }),
        Opcode::DATA_IN => Pdu::DataIn(DataIn {
            final_bit: bit(b1, 0x80),
            acknowledge: bit(b1, 0x40),
            overflow: bit(b1, 0x04),
            underflow: bit(b1, 0x02),
            status_present: bit(b1, 0x01),
            status: h[3],
            lun: u64_at(h, 8),
            itt: u32_at(h, 16),
            ttt: u32_at(h, 20),
            stat_sn: u32_at(h, 24),
            exp_cmd_sn: u32_at(h, 28),
            max_cmd_sn: u32_at(h, 32),
            data_sn: u32_at(h, 36),
            buffer_offset: u32_at(h, 40),
            residual: u32_at(h, 44),
            data,
        }),
        Opcode::LOGOUT_RESPONSE => Pdu::LogoutResponse(LogoutResponse {
            response: h[2],
            itt: u32_at(h, 16),
            stat_sn: u32_at(h, 24),
            exp_cmd_sn: u32_at(h, 28),
            max_cmd_sn: u32_at(h, 32),
            time2wait: u16_at(h, 40),
            time2retain: u16_at(h, 42),
        }),
        Opcode::R2T => Pdu::R2t(R2t {
            lun: u64_at(h, 8),
            itt: u32_at(h, 16),
            ttt: u32_at(h, 20),
            stat_sn: u32_at(h, 24),
            exp_cmd_sn: u32_at(h, 28),
            max_cmd_sn: u32_at(h, 32),
            r2t_sn: u32_at(h, 36),
            buffer_offset: u32_at(h, 40),
            desired_length: u32_at(h, 44),
        }),
        Opcode::ASYNC_MESSAGE => Pdu::AsyncMessage(AsyncMessage {
            lun: u64_at(h, 8),
            stat_sn: u32_at(h, 24),
            exp_cmd_sn: u32_at(h, 28),
            max_cmd_sn: u32_at(h, 32),
            event: h[36],
            vendor_code: h[37],
            parameter1: u16_at(h, 38),
            parameter2: u16_at(h, 40),
            parameter3: u16_at(h, 42),
            data,
        }),
        Opcode::REJECT => Pdu::Reject(Reject {
            reason: h[2],
            stat_sn: u32_at(h, 24),
            exp_cmd_sn: u32_at(h, 28),
            max_cmd_sn: u32_at(h, 32),
            data_sn_or_r2t_sn: u32_at(h, 36),
            data,
        }),
        other => Pdu::Unknown {
            opcode: other,
            header: Box::new(*h),
            data,
        },
    };
    Ok(pdu)
}

/// Writes the BHS of `pdu` into `h` (DataSegmentLength and TotalAHSLength are left to the
/// framer) and appends its AHS, if any, to `ahs`.
pub(crate) fn encode(pdu: &Pdu, h: &mut Header, ahs: &mut BytesMut) {
    *h = [0u8; BHS_LEN];
    h[0] = pdu.opcode().0 & 0x3f;
    match pdu {
        Pdu::NopOut(p) => {
            h[0] |= flag(p.immediate, 0x40);
            h[1] = 0x80;
            put64(h, 8, p.lun);
            put32(h, 16, p.itt);
            put32(h, 20, p.ttt);
            put32(h, 24, p.cmd_sn);
            put32(h, 28, p.exp_stat_sn);
        }
        Pdu::ScsiCommand(p) => {
            h[0] |= flag(p.immediate, 0x40);
            h[1] = flag(p.final_bit, 0x80)
                | flag(p.read, 0x40)
                | flag(p.write, 0x20)
                | (p.attr & 0x07);
            put64(h, 8, p.lun);
            put32(h, 16, p.itt);
            put32(h, 20, p.expected_data_length);
            put32(h, 24, p.cmd_sn);
            put32(h, 28, p.exp_stat_sn);
            h[32..48].copy_from_slice(&p.cdb);
            if let Some(ext) = &p.extended_cdb {
                let len = u16::try_from(ext.len() + 1).unwrap_or(u16::MAX);
                ahs.put_u16(len);
                ahs.put_u8(1);
                ahs.put_u8(0);
                ahs.put_slice(ext);
                while ahs.len() & 3 != 0 {
                    ahs.put_u8(0);
                }
            }
            if let Some(bidi) = p.bidi_read_length {
                ahs.put_u16(5);
                ahs.put_u8(2);
                ahs.put_u8(0);
                // 11.2.2.4: AHSLength 5 = reserved byte + 4-byte length; 8 bytes in all, already
                // a multiple of 4, so no padding follows.
                ahs.put_u32(bidi);
            }
        }
        Pdu::TaskMgmtRequest(p) => {
            h[0] |= flag(p.immediate, 0x40);
            h[1] = 0x80 | (p.function & 0x7f);
            put64(h, 8, p.lun);
            put32(h, 16, p.itt);
            put32(h, 20, p.referenced_task_tag);
            put32(h, 24, p.cmd_sn);
            put32(h, 28, p.exp_stat_sn);
            put32(h, 32, p.ref_cmd_sn);
            put32(h, 36, p.exp_data_sn);
        }
        Pdu::LoginRequest(p) => {
            h[0] |= 0x40;
            h[1] = flag(p.transit, 0x80)
                | flag(p.continue_bit, 0x40)
                | ((p.csg & 3) << 2)
                | (p.nsg & 3);
            h[2] = p.version_max;
            h[3] = p.version_min;
            h[8..14].copy_from_slice(&p.isid);
            put16(h, 14, p.tsih);
            put32(h, 16, p.itt);
            put16(h, 20, p.cid);
            put32(h, 24, p.cmd_sn);
            put32(h, 28, p.exp_stat_sn);
        }
        Pdu::TextRequest(p) => {
            h[0] |= flag(p.immediate, 0x40);
            h[1] = flag(p.final_bit, 0x80) | flag(p.continue_bit, 0x40);
            put64(h, 8, p.lun);
            put32(h, 16, p.itt);
            put32(h, 20, p.ttt);
            put32(h, 24, p.cmd_sn);
            put32(h, 28, p.exp_stat_sn);
        }
        Pdu::DataOut(p) => {
            h[1] = flag(p.final_bit, 0x80);
            put64(h, 8, p.lun);
            put32(h, 16, p.itt);
            put32(h, 20, p.ttt);
            put32(h, 28, p.exp_stat_sn);
            put32(h, 36, p.data_sn);
            put32(h, 40, p.buffer_offset);
        }
        Pdu::LogoutRequest(p) => {
            h[0] |= flag(p.immediate, 0x40);
            h[1] = 0x80 | (p.reason & 0x7f);
            put32(h, 16, p.itt);
            put16(h, 20, p.cid);
            put32(h, 24, p.cmd_sn);
            put32(h, 28, p.exp_stat_sn);
        }
        Pdu::SnackRequest(p) => {
            h[1] = 0x80 | (p.snack_type & 0x0f);
            put64(h, 8, p.lun);
            put32(h, 16, p.itt);
            put32(h, 20, p.ttt);
            put32(h, 28, p.exp_stat_sn);
            put32(h, 40, p.beg_run);
            put32(h, 44, p.run_length);
        }
        Pdu::NopIn(p) => {
            h[1] = 0x80;
            put64(h, 8, p.lun);
            put32(h, 16, p.itt);
            put32(h, 20, p.ttt);
            put32(h, 24, p.stat_sn);
            put32(h, 28, p.exp_cmd_sn);
            put32(h, 32, p.max_cmd_sn);
        }
        Pdu::ScsiResponse(p) => {
            h[1] = 0x80
                | flag(p.bidi_overflow, 0x10)
                | flag(p.bidi_underflow, 0x08)
                | flag(p.overflow, 0x04)
                | flag(p.underflow, 0x02);
            h[2] = p.response;
            h[3] = p.status;
            put32(h, 16, p.itt);
            put32(h, 20, p.snack_tag);
            put32(h, 24, p.stat_sn);
            put32(h, 28, p.exp_cmd_sn);
            put32(h, 32, p.max_cmd_sn);
            put32(h, 36, p.exp_data_sn);
            put32(h, 40, p.bidi_residual);
            put32(h, 44, p.residual);
        }
        Pdu::TaskMgmtResponse(p) => {
            h[1] = 0x80;
            h[2] = p.response;
            put32(h, 16, p.itt);
            put32(h, 24, p.stat_sn);
            put32(h, 28, p.exp_cmd_sn);
            put32(h, 32, p.max_cmd_sn);
        }
        Pdu::LoginResponse(p) => {
            h[1] = flag(p.transit, 0x80)
                | flag(p.continue_bit, 0x40)
                | ((p.csg & 3) << 2)
                | (p.nsg & 3);
            h[2] = p.version_max;
            h[3] = p.version_active;
            h[8..14].copy_from_slice(&p.isid);
            put16(h, 14, p.tsih);
            put32(h, 16, p.itt);
            put32(h, 24, p.stat_sn);
            put32(h, 28, p.exp_cmd_sn);
            put32(h, 32, p.max_cmd_sn);
            h[36] = p.status_class;
            h[37] = p.status_detail;
        }
        Pdu::TextResponse(p) => {
            h[1] = flag(p.final_bit, 0x80) | flag(p.continue_bit, 0x40);
            put64(h, 8, p.lun);
            put32(h, 16, p.itt);
            put32(h, 20, p.ttt);
            put32(h, 24, p.stat_sn);
            put32(h, 28, p.exp_cmd_sn);
            put32(h, 32, p.max_cmd_sn);
        }
        Pdu::DataIn(p) => {
            h[1] = flag(p.final_bit, 0x80)
                | flag(p.acknowledge, 0x40)
                | flag(p.overflow, 0x04)
                | flag(p.underflow, 0x02)
                | flag(p.status_present, 0x01);
            h[3] = p.status;
            put64(h, 8, p.lun);
            put32(h, 16, p.itt);
            put32(h, 20, p.ttt);
            put32(h, 24, p.stat_sn);
            put32(h, 28, p.exp_cmd_sn);
            put32(h, 32, p.max_cmd_sn);
            put32(h, 36, p.data_sn);
            put32(h, 40, p.buffer_offset);
            put32(h, 44, p.residual);
        }
        Pdu::LogoutResponse(p) => {
            h[1] = 0x80;
            h[2] = p.response;
            put32(h, 16, p.itt);
            put32(h, 24, p.stat_sn);
            put32(h, 28, p.exp_cmd_sn);
            put32(h, 32, p.max_cmd_sn);
            put16(h, 40, p.time2wait);
            put16(h, 42, p.time2retain);
        }
        Pdu::R2t(p) => {
            h[1] = 0x80;
            put64(h, 8, p.lun);
            put32(h, 16, p.itt);
            put32(h, 20, p.ttt);
            put32(h, 24, p.stat_sn);
            put32(h, 28, p.exp_cmd_sn);
            put32(h, 32, p.max_cmd_sn);
            put32(h, 36, p.r2t_sn);
            put32(h, 40, p.buffer_offset);
            put32(h, 44, p.desired_length);
        }
        Pdu::AsyncMessage(p) => {
            h[1] = 0x80;
            put64(h, 8, p.lun);
            put32(h, 16, RESERVED_TAG);
            put32(h, 24, p.stat_sn);
            put32(h, 28, p.exp_cmd_sn);
            put32(h, 32, p.max_cmd_sn);
            h[36] = p.event;
            h[37] = p.vendor_code;
            put16(h, 38, p.parameter1);
            put16(h, 40, p.parameter2);
            put16(h, 42, p.parameter3);
        }
        Pdu::Reject(p) => {
            h[1] = 0x80;
            h[2] = p.reason;
            put32(h, 16, RESERVED_TAG);
            put32(h, 24, p.stat_sn);
            put32(h, 28, p.exp_cmd_sn);
            put32(h, 32, p.max_cmd_sn);
            put32(h, 36, p.data_sn_or_r2t_sn);
        }
        Pdu::Unknown { header, .. } => {
            *h = **header;
        }
    }
}
