//! OPLOCK_BREAK notifications, acknowledgments and responses for oplocks and leases
//! (MS-SMB2 2.2.23 to 2.2.25). The StructureSize tells the variant apart.

use super::{FileId, Message};
use crate::error::DecodeError;
use crate::header::HEADER_LEN;
use crate::wire::{put_u16, put_u32, put_u64, Reader};

pub const LEASE_NONE: u32 = 0;
pub const LEASE_READ: u32 = 0x01;
pub const LEASE_HANDLE: u32 = 0x02;
pub const LEASE_WRITE: u32 = 0x04;
pub const LEASE_BREAK_ACK_REQUIRED: u32 = 0x01;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OplockBreak {
    /// Oplock break notification, acknowledgment or response (24 bytes, same layout).
    Oplock { oplock_level: u8, file_id: FileId },
    /// Lease break notification (server to client).
    LeaseNotification {
        new_epoch: u16,
        flags: u32,
        lease_key: [u8; 16],
        current_lease_state: u32,
        new_lease_state: u32,
    },
    /// Lease break acknowledgment (client) or response (server).
    LeaseAck {
        flags: u32,
        lease_key: [u8; 16],
        lease_state: u32,
    },
}

impl<'a> Message<'a> for OplockBreak {
    const STRUCTURE_SIZE: u16 = 24;
    const NAME: &'static str = "OPLOCK_BREAK";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::at(msg, HEADER_LEN, Self::NAME);
        match r.u16()? {
            24 => {
                let oplock_level = r.u8()?;
                r.u8()?;
                r.u32()?;
                Ok(OplockBreak::Oplock {
                    oplock_level,
                    file_id: FileId::read(&mut r)?,
                })
            }
            44 => {
                let new_epoch = r.u16()?;
                let flags = r.u32()?;
                let lease_key = r.array()?;
                let current_lease_state = r.u32()?;
                let new_lease_state = r.u32()?;
                r.skip(12)?;
                Ok(OplockBreak::LeaseNotification {
                    new_epoch,
                    flags,
                    lease_key,
                    current_lease_state,
                    new_lease_state,
                })
            }
            36 => {
                r.u16()?;
                let flags = r.u32()?;
                let lease_key = r.array()?;
                let lease_state = r.u32()?;
                r.u64()?;
                Ok(OplockBreak::LeaseAck {
                    flags,
                    lease_key,
                    lease_state,
                })
            }
            found => Err(DecodeError::StructureSize {
                what: Self::NAME,
                expected: 24,
                found,
            }),
        }
    }
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            OplockBreak::Oplock {
                oplock_level,
                file_id,
            } => {
                put_u16(out, 24);
                out.push(*oplock_level);
                out.push(0);
                put_u32(out, 0);
                file_id.write(out);
            }
            OplockBreak::LeaseNotification {
                new_epoch,
                flags,
                lease_key,
                current_lease_state,
                new_lease_state,
            } => {
                put_u16(out, 44);
                put_u16(out, *new_epoch);
                put_u32(out, *flags);
                out.extend_from_slice(lease_key);
                put_u32(out, *current_lease_state);
                put_u32(out, *new_lease_state);
                out.extend_from_slice(&[0; 12]);
            }
            OplockBreak::LeaseAck {
                flags,
                lease_key,
                lease_state,
            } => {
                put_u16(out, 36);
                put_u16(out, 0);
                put_u32(out, *flags);
                out.extend_from_slice(lease_key);
                put_u32(out, *lease_state);
                put_u64(out, 0);
            }
        }
    }
}
