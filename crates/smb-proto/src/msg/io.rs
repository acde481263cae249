//! READ, WRITE and FLUSH (MS-SMB2 2.2.17 to 2.2.22). Data is never copied on decode: the write
//! payload borrows the frame, and a read response's fixed part can be encoded alone so the
//! payload goes out as a second slice of one vectored write.

use super::{body, FileId, Message};
use crate::error::DecodeError;
use crate::header::HEADER_LEN;
use crate::wire::{buffer, put_u16, put_u32, put_u64};

pub const READ_FLAG_READ_UNBUFFERED: u8 = 0x01;
pub const WRITE_FLAG_WRITE_THROUGH: u32 = 0x01;
pub const CHANNEL_NONE: u32 = 0;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadRequest<'a> {
    pub padding: u8,
    pub flags: u8,
    pub length: u32,
    pub offset: u64,
    pub file_id: FileId,
    pub minimum_count: u32,
    pub channel: u32,
    pub remaining_bytes: u32,
    pub read_channel_info: &'a [u8],
}

impl<'a> Message<'a> for ReadRequest<'a> {
    const STRUCTURE_SIZE: u16 = 49;
    const NAME: &'static str = "READ request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let padding = r.u8()?;
        let flags = r.u8()?;
        let length = r.u32()?;
        let offset = r.u64()?;
        let file_id = FileId::read(&mut r)?;
        let minimum_count = r.u32()?;
        let channel = r.u32()?;
        let remaining_bytes = r.u32()?;
        let ci_off = r.u16()? as usize;
        let ci_len = r.u16()? as usize;
        let read_channel_info = buffer(msg, ci_off, ci_len, r.pos(), Self::NAME)?;
        Ok(ReadRequest {
            padding,
            flags,
            length,
            offset,
            file_id,
            minimum_count,
            channel,
            remaining_bytes,
            read_channel_info,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        out.push(self.padding);
        out.push(self.flags);
        put_u32(out, self.length);
        put_u64(out, self.offset);
        self.file_id.write(out);
        put_u32(out, self.minimum_count);
        put_u32(out, self.channel);
        put_u32(out, self.remaining_bytes);
        let off = if self.read_channel_info.is_empty() {
            0
        } else {
            HEADER_LEN as u16 + 48
        };
        put_u16(out, off);
        put_u16(out, self.read_channel_info.len() as u16);
        if self.read_channel_info.is_empty() {
            out.push(0);
        }
        out.extend_from_slice(self.read_channel_info);
    }
}

/// READ response. The data starts at offset 0x50, right after the 16-byte fixed part.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadResponse<'a> {
    pub data_remaining: u32,
    pub flags: u32,
    pub data: &'a [u8],
}

impl ReadResponse<'_> {
    pub const DATA_OFFSET: u8 = (HEADER_LEN + 16) as u8;

    /// The 16-byte fixed part announcing `data_len` bytes; the payload follows separately.
    pub fn encode_head(data_len: u32, data_remaining: u32, flags: u32, out: &mut Vec<u8>) {
        put_u16(out, 17);
        out.push(Self::DATA_OFFSET);
        out.push(0);
        put_u32(out, data_len);
        put_u32(out, data_remaining);
        put_u32(out, flags);
    }
}

impl<'a> Message<'a> for ReadResponse<'a> {
    const STRUCTURE_SIZE: u16 = 17;
    const NAME: &'static str = "READ response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let off = r.u8()? as usize;
        r.u8()?;
        let len = r.u32()? as usize;
        let data_remaining = r.u32()?;
        let flags = r.u32()?;
        let data = buffer(msg, off, len, r.pos(), Self::NAME)?;
        Ok(ReadResponse {
            data_remaining,
            flags,
            data,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        Self::encode_head(self.data.len() as u32, self.data_remaining, self.flags, out);
        if self.data.is_empty() {
            out.push(0);
        }
        out.extend_from_slice(self.data);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WriteRequest<'a> {
    pub offset: u64,
    pub file_id: FileId,
    pub channel: u32,
    pub remaining_bytes: u32,
    pub flags: u32,
    pub write_channel_info: &'a [u8],
    /// The payload, borrowed from the frame.
    pub data: &'a [u8],
}

impl WriteRequest<'_> {
    /// The 48-byte fixed part announcing `data_len` bytes of data right after it, so a client
    /// sends the payload as a second slice of one vectored write (no write channel info).
    pub fn encode_head(&self, data_len: u32, out: &mut Vec<u8>) {
        put_u16(out, 49);
        put_u16(out, HEADER_LEN as u16 + 48);
        put_u32(out, data_len);
        put_u64(out, self.offset);
        self.file_id.write(out);
        put_u32(out, self.channel);
        put_u32(out, self.remaining_bytes);
        put_u16(out, 0);
        put_u16(out, 0);
        put_u32(out, self.flags);
    }
}

impl<'a> Message<'a> for WriteRequest<'a> {
    const STRUCTURE_SIZE: u16 = 49;
    const NAME: &'static str = "WRITE request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let data_off = r.u16()? as usize;
        let len = r.u32()? as usize;
        let offset = r.u64()?;
        let file_id = FileId::read(&mut r)?;
        let channel = r.u32()?;
        let remaining_bytes = r.u32()?;
        let ci_off = r.u16()? as usize;
        let ci_len = r.u16()? as usize;
        let flags = r.u32()?;
        let data = buffer(msg, data_off, len, r.pos(), Self::NAME)?;
        let write_channel_info = buffer(msg, ci_off, ci_len, r.pos(), Self::NAME)?;
        Ok(WriteRequest {
            offset,
            file_id,
            channel,
            remaining_bytes,
            flags,
            write_channel_info,
            data,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let data_off = HEADER_LEN as u16 + 48;
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, data_off);
        put_u32(out, self.data.len() as u32);
        put_u64(out, self.offset);
        self.file_id.write(out);
        put_u32(out, self.channel);
        put_u32(out, self.remaining_bytes);
        let ci_off = if self.write_channel_info.is_empty() {
            0
        } else {
            data_off + self.data.len() as u16
        };
        put_u16(out, ci_off);
        put_u16(out, self.write_channel_info.len() as u16);
        put_u32(out, self.flags);
        out.extend_from_slice(self.data);
        out.extend_from_slice(self.write_channel_info);
        if self.data.is_empty() && self.write_channel_info.is_empty() {
            out.push(0);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteResponse {
    pub count: u32,
    pub remaining: u32,
}

impl<'a> Message<'a> for WriteResponse {
    const STRUCTURE_SIZE: u16 = 17;
    const NAME: &'static str = "WRITE response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        r.u16()?;
        let count = r.u32()?;
        let remaining = r.u32()?;
        r.u32()?;
        Ok(WriteResponse { count, remaining })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, 0);
        put_u32(out, self.count);
        put_u32(out, self.remaining);
        put_u32(out, 0);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlushRequest {
    pub file_id: FileId,
}

impl<'a> Message<'a> for FlushRequest {
    const STRUCTURE_SIZE: u16 = 24;
    const NAME: &'static str = "FLUSH request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        r.u16()?;
        r.u32()?;
        Ok(FlushRequest {
            file_id: FileId::read(&mut r)?,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, 0);
        put_u32(out, 0);
        self.file_id.write(out);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlushResponse;

impl<'a> Message<'a> for FlushResponse {
    const STRUCTURE_SIZE: u16 = 4;
    const NAME: &'static str = "FLUSH response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        body(msg, Self::STRUCTURE_SIZE, Self::NAME)?.u16()?;
        Ok(FlushResponse)
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, 0);
    }
}
