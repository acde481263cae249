//! CDB decoding: turns raw command bytes into a [`Command`], validating every field up front.
//!
//! Decoding never touches the logical unit; checks that need its state (capacity, block limits)
//! happen at execution. Every failure is the sense data the initiator should see.

pub use crate::command::{op, BlockRange, Command};
use crate::sense::Sense;

/// Length of the CDB for an operation code's group (SPC-4 4.2.5.1); `None` for vendor groups.
pub fn cdb_length(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

fn byte(cdb: &[u8], i: usize) -> Result<u8, Sense> {
    cdb.get(i).copied().ok_or(Sense::invalid_cdb(i, None))
}

fn be(cdb: &[u8], at: usize, n: usize) -> Result<u64, Sense> {
    let bytes = cdb.get(at..at + n).ok_or(Sense::invalid_cdb(at, None))?;
    Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
}

fn be32(cdb: &[u8], at: usize, n: usize) -> Result<u32, Sense> {
    be(cdb, at, n).map(|v| v as u32)
}

/// Rejects a nonzero protection field (bits 7..5 of byte 1): there is no protection information.
fn no_protect(cdb: &[u8]) -> Result<u8, Sense> {
    let b1 = byte(cdb, 1)?;
    if b1 & 0xE0 != 0 {
        return Err(Sense::invalid_cdb(1, Some(7)));
    }
    Ok(b1)
}

/// NACA/LINK in the control byte are not supported (SAM-5 5.2).
fn check_control(cdb: &[u8], len: usize) -> Result<(), Sense> {
    let at = len - 1;
    if byte(cdb, at)? & 0x05 != 0 {
        return Err(Sense::invalid_cdb(at, Some(2)));
    }
    Ok(())
}

fn rw(
    cdb: &[u8],
    lba_at: usize,
    lba_n: usize,
    len_at: usize,
    len_n: usize,
) -> Result<BlockRange, Sense> {
    let b1 = no_protect(cdb)?;
    Ok(BlockRange {
        lba: be(cdb, lba_at, lba_n)?,
        blocks: be32(cdb, len_at, len_n)?,
        fua: b1 & 0x08 != 0,
    })
}

/// Decodes one CDB. Never panics, whatever the bytes.
pub fn decode_cdb(cdb: &[u8]) -> Result<Command, Sense> {
    let opcode = *cdb.first().ok_or(Sense::invalid_opcode())?;
    let len = cdb_length(opcode).ok_or(Sense::invalid_opcode())?;
    if cdb.len() < len {
        return Err(Sense::invalid_cdb(cdb.len(), None));
    }
    let cmd = match opcode {
        op::TEST_UNIT_READY => Command::TestUnitReady,
        op::REQUEST_SENSE => Command::RequestSense {
            desc: byte(cdb, 1)? & 1 != 0,
            alloc: be32(cdb, 4, 1)?,
        },
        op::INQUIRY => {
            let b1 = byte(cdb, 1)?;
            if b1 & 0xFE != 0 {
                return Err(Sense::invalid_cdb(1, Some(1)));
            }
            let evpd = b1 & 1 != 0;
            let page = byte(cdb, 2)?;
            if !evpd && page != 0 {
                return Err(Sense::invalid_cdb(2, None));
            }
            Command::Inquiry {
                evpd,
                page,
                alloc: be32(cdb, 3, 2)?,
            }
        }
        op::REPORT_LUNS => Command::ReportLuns {
            select: byte(cdb, 2)?,
            alloc: be32(cdb, 6, 4)?,
        },
        op::READ_CAPACITY_10 => {
            let pmi = byte(cdb, 8)? & 1 != 0;
            if !pmi && be(cdb, 2, 4)? != 0 {
                return Err(Sense::invalid_cdb(2, None));
            }
            Command::ReadCapacity10
        }
        op::READ_6 | op::WRITE_6 => {
            let lba = be(cdb, 1, 3)? & 0x1F_FFFF;
            let n = be32(cdb, 4, 1)?;
            let range = BlockRange {
                lba,
                blocks: if n == 0 { 256 } else { n },
                fua: false,
            };
            if opcode == op::READ_6 {
                Command::Read(range)
            } else {
                Command::Write(range)
            }
        }
        op::READ_10 => Command::Read(rw(cdb, 2, 4, 7, 2)?),
        op::READ_12 => Command::Read(rw(cdb, 2, 4, 6, 4)?),
        op::READ_16 => Command::Read(rw(cdb, 2, 8, 10, 4)?),
        op::WRITE_10 => Command::Write(rw(cdb, 2, 4, 7, 2)?),
        op::WRITE_12 => Command::Write(rw(cdb, 2, 4, 6, 4)?),
        op::WRITE_16 => Command::Write(rw(cdb, 2, 8, 10, 4)?),
        op::WRITE_AND_VERIFY_10 | op::WRITE_AND_VERIFY_12 | op::WRITE_AND_VERIFY_16 => {
            let range = match opcode {
                op::WRITE_AND_VERIFY_10 => rw(cdb, 2, 4, 7, 2)?,
                op::WRITE_AND_VERIFY_12 => rw(cdb, 2, 4, 6, 4)?,
                _ => rw(cdb, 2, 8, 10, 4)?,
            };
            let bytchk = (byte(cdb, 1)? >> 1) & 3;
            if bytchk > 1 {
                return Err(Sense::invalid_cdb(1, Some(2)));
            }
            Command::WriteAndVerify {
                range: BlockRange {
                    fua: false,
                    ..range
                },
                bytchk: bytchk == 1,
            }
        }
        op::VERIFY_10 | op::VERIFY_12 | op::VERIFY_16 => {
            let range = match opcode {
                op::VERIFY_10 => rw(cdb, 2, 4, 7, 2)?,
                op::VERIFY_12 => rw(cdb, 2, 4, 6, 4)?,
                _ => rw(cdb, 2, 8, 10, 4)?,
            };
            let bytchk = (byte(cdb, 1)? >> 1) & 3;
            if bytchk == 2 {
                return Err(Sense::invalid_cdb(1, Some(2)));
            }
            Command::Verify {
                range: BlockRange {
                    fua: false,
                    ..range
                },
                bytchk,
            }
        }
        op::WRITE_SAME_10 | op::WRITE_SAME_16 => {
            let b1 = no_protect(cdb)?;
            let (lba, blocks, ndob) = if opcode == op::WRITE_SAME_10 {
                (be(cdb, 2, 4)?, be32(cdb, 7, 2)?, false)
            } else {
                (be(cdb, 2, 8)?, be32(cdb, 10, 4)?, b1 & 1 != 0)
            };
            Command::WriteSame {
                lba,
                blocks,
                unmap: b1 & 0x08 != 0,
                anchor: b1 & 0x10 != 0,
                ndob,
            }
        }
        op::UNMAP => Command::Unmap {
            anchor: byte(cdb, 1)? & 1 != 0,
            param_len: be32(cdb, 7, 2)?,
        },
        op::COMPARE_AND_WRITE => {
            let b1 = no_protect(cdb)?;
            Command::CompareAndWrite(BlockRange {
                lba: be(cdb, 2, 8)?,
                blocks: be32(cdb, 13, 1)?,
                fua: b1 & 0x08 != 0,
            })
        }
        op::PRE_FETCH_10 => Command::PreFetch {
            lba: be(cdb, 2, 4)?,
            blocks: be32(cdb, 7, 2)?,
        },
        op::PRE_FETCH_16 => Command::PreFetch {
            lba: be(cdb, 2, 8)?,
            blocks: be32(cdb, 10, 4)?,
        },
        op::SYNCHRONIZE_CACHE_10 => Command::SynchronizeCache {
            lba: be(cdb, 2, 4)?,
            blocks: be32(cdb, 7, 2)?,
        },
        op::SYNCHRONIZE_CACHE_16 => Command::SynchronizeCache {
            lba: be(cdb, 2, 8)?,
            blocks: be32(cdb, 10, 4)?,
        },
        op::MODE_SENSE_6 | op::MODE_SENSE_10 => {
            let ten = opcode == op::MODE_SENSE_10;
            let b1 = byte(cdb, 1)?;
            let b2 = byte(cdb, 2)?;
            let alloc = if ten {
                be32(cdb, 7, 2)?
            } else {
                be32(cdb, 4, 1)?
            };
            Command::ModeSense {
                ten,
                dbd: b1 & 0x08 != 0,
                llbaa: ten && b1 & 0x10 != 0,
                pc: b2 >> 6,
                page: b2 & 0x3F,
                subpage: byte(cdb, 3)?,
                alloc,
            }
        }
        op::MODE_SELECT_6 | op::MODE_SELECT_10 => {
            let ten = opcode == op::MODE_SELECT_10;
            let b1 = byte(cdb, 1)?;
            let param_len = if ten {
                be32(cdb, 7, 2)?
            } else {
                be32(cdb, 4, 1)?
            };
            Command::ModeSelect {
                ten,
                pf: b1 & 0x10 != 0,
                sp: b1 & 1 != 0,
                param_len,
            }
        }
        op::START_STOP_UNIT => {
            let b4 = byte(cdb, 4)?;
            Command::StartStopUnit {
                loej: b4 & 2 != 0,
                start: b4 & 1 != 0,
            }
        }
        op::PREVENT_ALLOW => Command::PreventAllow {
            prevent: byte(cdb, 4)? & 3,
        },
        op::SERVICE_ACTION_IN_16 => match byte(cdb, 1)? & 0x1F {
            0x10 => Command::ReadCapacity16 {
                alloc: be32(cdb, 10, 4)?,
            },
            0x12 => Command::GetLbaStatus {
                lba: be(cdb, 2, 8)?,
                alloc: be32(cdb, 10, 4)?,
            },
            _ => return Err(Sense::invalid_cdb(1, Some(4))),
        },
        op::RESERVE_6 | op::RESERVE_10 => {
            if opcode == op::RESERVE_10 && byte(cdb, 1)? & 0x12 != 0 {
                return Err(Sense::invalid_cdb(1, Some(4)));
            }
            Command::Reserve
        }
        op::RELEASE_6 | op::RELEASE_10 => {
            if opcode == op::RELEASE_10 && byte(cdb, 1)? & 0x12 != 0 {
                return Err(Sense::invalid_cdb(1, Some(4)));
            }
            Command::Release
        }
        op::PERSISTENT_RESERVE_IN => {
            let action = byte(cdb, 1)? & 0x1F;
            if action > 3 {
                return Err(Sense::invalid_cdb(1, Some(4)));
            }
            Command::PersistentReserveIn {
                action,
                alloc: be32(cdb, 7, 2)?,
            }
        }
        op::PERSISTENT_RESERVE_OUT => {
            let action = byte(cdb, 1)? & 0x1F;
            if action > 7 {
                return Err(Sense::invalid_cdb(1, Some(4)));
            }
            let b2 = byte(cdb, 2)?;
            Command::PersistentReserveOut {
                action,
                scope: b2 >> 4,
                kind: b2 & 0x0F,
                param_len: be32(cdb, 5, 4)?,
            }
        }
        op::MAINTENANCE_IN => {
            let b1 = byte(cdb, 1)?;
            match b1 & 0x1F {
                0x0A => {
                    let format = b1 >> 5;
                    if format > 1 {
                        return Err(Sense::invalid_cdb(1, Some(7)));
                    }
                    Command::ReportTargetPortGroups {
                        extended: format == 1,
                        alloc: be32(cdb, 6, 4)?,
                    }
                }
                0x0C => {
                    let b2 = byte(cdb, 2)?;
                    let options = b2 & 7;
                    if options > 3 {
                        return Err(Sense::invalid_cdb(2, Some(2)));
                    }
                    Command::ReportSupportedOpcodes {
                        rctd: b2 & 0x80 != 0,
                        options,
                        opcode: byte(cdb, 3)?,
                        action: be(cdb, 4, 2)? as u16,
                        alloc: be32(cdb, 6, 4)?,
                    }
                }
                0x0D => Command::ReportSupportedTmf {
                    repd: byte(cdb, 2)? & 0x80 != 0,
                    alloc: be32(cdb, 6, 4)?,
                },
                _ => return Err(Sense::invalid_cdb(1, Some(4))),
            }
        }
        op::MAINTENANCE_OUT => match byte(cdb, 1)? & 0x1F {
            0x0A => Command::SetTargetPortGroups {
                param_len: be32(cdb, 6, 4)?,
            },
            _ => return Err(Sense::invalid_cdb(1, Some(4))),
        },
        op::EXTENDED_COPY => {
            if byte(cdb, 1)? & 0x1F != 0 {
                return Err(Sense::invalid_cdb(1, Some(4)));
            }
            Command::ExtendedCopy {
                param_len: be32(cdb, 10, 4)?,
            }
        }
        op::RECEIVE_COPY_RESULTS => {
            let action = byte(cdb, 1)? & 0x1F;
            if !matches!(action, 0 | 1 | 3 | 4) {
                return Err(Sense::invalid_cdb(1, Some(4)));
            }
            Command::ReceiveCopyResults {
                action,
                list_id: byte(cdb, 2)?,
                alloc: be32(cdb, 10, 4)?,
            }
        }
        _ => return Err(Sense::invalid_opcode()),
    };
    check_control(cdb, len)?;
    Ok(cmd)
}

/// UNMAP, WRITE SAME(10/16) or COMPARE AND WRITE: what the asynchronous path takes when the
/// storage does them itself.
pub(crate) fn is_done_by_storage(opcode: u8) -> bool {
    matches!(
        opcode,
        op::UNMAP | op::WRITE_SAME_10 | op::WRITE_SAME_16 | op::COMPARE_AND_WRITE
    )
}

/// READ(6/10/12/16) or WRITE(6/10/12/16): the commands the inline and asynchronous paths take.
pub(crate) fn is_read_or_write(opcode: u8) -> bool {
    matches!(
        opcode,
        op::READ_6
            | op::READ_10
            | op::READ_12
            | op::READ_16
            | op::WRITE_6
            | op::WRITE_10
            | op::WRITE_12
            | op::WRITE_16
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read10_fields() {
        let c = decode_cdb(&[0x28, 0x08, 0, 0, 1, 0, 0, 0, 8, 0]).unwrap();
        assert_eq!(
            c,
            Command::Read(BlockRange {
                lba: 256,
                blocks: 8,
                fua: true
            })
        );
        let e = decode_cdb(&[0x28, 0x20, 0, 0, 1, 0, 0, 0, 8, 0]).unwrap_err();
        assert_eq!((e.key, e.asc), (5, 0x24));
        assert_eq!(decode_cdb(&[0x28, 0, 0]).unwrap_err().asc, 0x24);
    }

    #[test]
    fn read6_zero_means_256() {
        assert_eq!(
            decode_cdb(&[0x08, 0xE1, 0, 2, 0, 0]).unwrap(),
            Command::Read(BlockRange {
                lba: 0x10002,
                blocks: 256,
                fua: false
            })
        );
    }

    #[test]
    fn bad_opcodes_and_fields() {
        assert_eq!(decode_cdb(&[0xFF; 16]).unwrap_err().asc, 0x20);
        assert_eq!(decode_cdb(&[0x02, 0, 0, 0, 0, 0]).unwrap_err().asc, 0x20);
        assert_eq!(decode_cdb(&[]).unwrap_err().asc, 0x20);
        assert_eq!(
            decode_cdb(&[0x12, 0, 0x80, 0, 255, 0]).unwrap_err().asc,
            0x24
        );
        assert_eq!(decode_cdb(&[0x12, 2, 0, 0, 255, 0]).unwrap_err().asc, 0x24);
        assert_eq!(decode_cdb(&[0x00, 0, 0, 0, 0, 1]).unwrap_err().asc, 0x24);
        let mut c = [0u8; 16];
        c[0] = 0x9E;
        c[1] = 0x11;
        assert_eq!(decode_cdb(&c).unwrap_err().asc, 0x24);
    }
}
