//! Transmission-phase messages: the request header and the simple reply header.

use bytes::{Buf, BufMut};

use super::{
    need, Command, CommandFlags, ErrorCode, ProtoError, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC,
};

/// C: a transmission request header ("Request message"); a write's payload follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: CommandFlags,
    pub command: Command,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    pub const LEN: usize = 28;

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u32(REQUEST_MAGIC);
        buf.put_u16(self.flags.0);
        buf.put_u16(self.command.0);
        buf.put_u64(self.cookie);
        buf.put_u64(self.offset);
        buf.put_u32(self.length);
    }

    pub fn decode(buf: &mut impl Buf) -> Result<Request, ProtoError> {
        need(buf, Self::LEN)?;
        let magic = buf.get_u32();
        if magic != REQUEST_MAGIC {
            return Err(ProtoError::BadMagic {
                expected: u64::from(REQUEST_MAGIC),
                found: u64::from(magic),
            });
        }
        Ok(Request {
            flags: CommandFlags(buf.get_u16()),
            command: Command(buf.get_u16()),
            cookie: buf.get_u64(),
            offset: buf.get_u64(),
            length: buf.get_u32(),
        })
    }

    /// Payload bytes that follow this header on the wire (only writes carry one).
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::WRITE {
            self.length
        } else {
            0
        }
    }
}

/// S: a simple reply header ("Simple reply message"); a successful read's data follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    pub error: ErrorCode,
    pub cookie: u64,
}

impl SimpleReply {
    pub const LEN: usize = 16;

    /// The header as bytes, for a vectored write with the data beside it.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        self.encode(&mut &mut out[..]);
        out
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u32(SIMPLE_REPLY_MAGIC);
        buf.put_u32(self.error.0);
        buf.put_u64(self.cookie);
    }

    pub fn decode(buf: &mut impl Buf) -> Result<SimpleReply, ProtoError> {
        need(buf, Self::LEN)?;
        let magic = buf.get_u32();
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(ProtoError::BadMagic {
                expected: u64::from(SIMPLE_REPLY_MAGIC),
                found: u64::from(magic),
            });
        }
        Ok(SimpleReply {
            error: ErrorCode(buf.get_u32()),
            cookie: buf.get_u64(),
        })
    }
}
