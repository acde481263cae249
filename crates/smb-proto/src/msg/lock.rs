//! LOCK (MS-SMB2 2.2.26, 2.2.27).

use super::{body, FileId, Message};
use crate::error::DecodeError;
use crate::wire::{put_u16, put_u32, put_u64};

pub const LOCKFLAG_SHARED_LOCK: u32 = 0x01;
pub const LOCKFLAG_EXCLUSIVE_LOCK: u32 = 0x02;
pub const LOCKFLAG_UNLOCK: u32 = 0x04;
pub const LOCKFLAG_FAIL_IMMEDIATELY: u32 = 0x10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LockElement {
    pub offset: u64,
    pub length: u64,
    pub flags: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockRequest {
    /// LockSequenceNumber (low 4 bits) and LockSequenceIndex (next 28 bits).
    pub lock_sequence: u32,
    pub file_id: FileId,
    pub locks: Vec<LockElement>,
}

impl LockRequest {
    pub fn sequence_number(&self) -> u8 {
        (self.lock_sequence & 0xF) as u8
    }
    pub fn sequence_index(&self) -> u32 {
        self.lock_sequence >> 4
    }
}

impl<'a> Message<'a> for LockRequest {
    const STRUCTURE_SIZE: u16 = 48;
    const NAME: &'static str = "LOCK request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let count = r.u16()?;
        if count == 0 {
            return Err(DecodeError::Invalid("LOCK with no lock element"));
        }
        let lock_sequence = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        let locks = (0..count)
            .map(|_| {
                let offset = r.u64()?;
                let length = r.u64()?;
                let flags = r.u32()?;
                r.u32()?;
                Ok(LockElement {
                    offset,
                    length,
                    flags,
                })
            })
            .collect::<Result<_, DecodeError>>()?;
        Ok(LockRequest {
            lock_sequence,
            file_id,
            locks,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, self.locks.len() as u16);
        put_u32(out, self.lock_sequence);
        self.file_id.write(out);
        for l in &self.locks {
            put_u64(out, l.offset);
            put_u64(out, l.length);
            put_u32(out, l.flags);
            put_u32(out, 0);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LockResponse;

impl<'a> Message<'a> for LockResponse {
    const STRUCTURE_SIZE: u16 = 4;
    const NAME: &'static str = "LOCK response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        body(msg, Self::STRUCTURE_SIZE, Self::NAME)?.u16()?;
        Ok(LockResponse)
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, 0);
    }
}
