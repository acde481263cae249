//! QUERY_INFO, SET_INFO, QUERY_DIRECTORY and CHANGE_NOTIFY (MS-SMB2 2.2.33 to 2.2.40). The
//! info buffers stay raw: their classes (MS-FSCC) are the server's business.

use super::{body, here, FileId, Message};
use crate::error::DecodeError;
use crate::header::HEADER_LEN;
use crate::wire::{buffer, from_utf16le, put_u16, put_u32};

pub const INFO_FILE: u8 = 0x01;
pub const INFO_FILESYSTEM: u8 = 0x02;
pub const INFO_SECURITY: u8 = 0x03;
pub const INFO_QUOTA: u8 = 0x04;

pub const QUERY_DIRECTORY_RESTART_SCANS: u8 = 0x01;
pub const QUERY_DIRECTORY_RETURN_SINGLE_ENTRY: u8 = 0x02;
pub const QUERY_DIRECTORY_INDEX_SPECIFIED: u8 = 0x04;
pub const QUERY_DIRECTORY_REOPEN: u8 = 0x10;

pub const WATCH_TREE: u16 = 0x0001;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueryInfoRequest<'a> {
    pub info_type: u8,
    pub file_info_class: u8,
    pub output_buffer_length: u32,
    pub input: &'a [u8],
    pub additional_information: u32,
    pub flags: u32,
    pub file_id: FileId,
}

impl<'a> Message<'a> for QueryInfoRequest<'a> {
    const STRUCTURE_SIZE: u16 = 41;
    const NAME: &'static str = "QUERY_INFO request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let info_type = r.u8()?;
        let file_info_class = r.u8()?;
        let output_buffer_length = r.u32()?;
        let in_off = r.u16()? as usize;
        r.u16()?;
        let in_len = r.u32()? as usize;
        let additional_information = r.u32()?;
        let flags = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        Ok(QueryInfoRequest {
            info_type,
            file_info_class,
            output_buffer_length,
            input: buffer(msg, in_off, in_len, r.pos(), Self::NAME)?,
            additional_information,
            flags,
            file_id,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        out.push(self.info_type);
        out.push(self.file_info_class);
        put_u32(out, self.output_buffer_length);
        put_u16(
            out,
            if self.input.is_empty() {
                0
            } else {
                HEADER_LEN as u16 + 40
            },
        );
        put_u16(out, 0);
        put_u32(out, self.input.len() as u32);
        put_u32(out, self.additional_information);
        put_u32(out, self.flags);
        self.file_id.write(out);
        if self.input.is_empty() {
            out.push(0);
        }
        out.extend_from_slice(self.input);
    }
}

/// The shared shape of the QUERY_INFO, QUERY_DIRECTORY and CHANGE_NOTIFY responses: an output
/// buffer right after an 8-byte fixed part.
macro_rules! output_response {
    ($(#[$m:meta])* $name:ident, $what:literal) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Default)]
        pub struct $name<'a> {
            pub output: &'a [u8],
        }

        impl<'a> Message<'a> for $name<'a> {
            const STRUCTURE_SIZE: u16 = 9;
            const NAME: &'static str = $what;
            fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
                let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
                let off = r.u16()? as usize;
                let len = r.u32()? as usize;
                Ok($name {
                    output: buffer(msg, off, len, r.pos(), Self::NAME)?,
                })
            }
            fn encode(&self, out: &mut Vec<u8>) {
                put_u16(out, Self::STRUCTURE_SIZE);
                put_u16(out, HEADER_LEN as u16 + 8);
                put_u32(out, self.output.len() as u32);
                if self.output.is_empty() {
                    out.push(0);
                }
                out.extend_from_slice(self.output);
            }
        }
    };
}

output_response!(/// MS-SMB2 2.2.38
    QueryInfoResponse, "QUERY_INFO response");
output_response!(/// MS-SMB2 2.2.34
    QueryDirectoryResponse, "QUERY_DIRECTORY response");
output_response!(/// MS-SMB2 2.2.36
    ChangeNotifyResponse, "CHANGE_NOTIFY response");

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SetInfoRequest<'a> {
    pub info_type: u8,
    pub file_info_class: u8,
    pub additional_information: u32,
    pub file_id: FileId,
    pub buffer: &'a [u8],
}

impl<'a> Message<'a> for SetInfoRequest<'a> {
    const STRUCTURE_SIZE: u16 = 33;
    const NAME: &'static str = "SET_INFO request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let info_type = r.u8()?;
        let file_info_class = r.u8()?;
        let len = r.u32()? as usize;
        let off = r.u16()? as usize;
        r.u16()?;
        let additional_information = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        Ok(SetInfoRequest {
            info_type,
            file_info_class,
            additional_information,
            file_id,
            buffer: buffer(msg, off, len, r.pos(), Self::NAME)?,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        out.push(self.info_type);
        out.push(self.file_info_class);
        put_u32(out, self.buffer.len() as u32);
        put_u16(out, HEADER_LEN as u16 + 32);
        put_u16(out, 0);
        put_u32(out, self.additional_information);
        self.file_id.write(out);
        if self.buffer.is_empty() {
            out.push(0);
        }
        out.extend_from_slice(self.buffer);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetInfoResponse;

impl<'a> Message<'a> for SetInfoResponse {
    const STRUCTURE_SIZE: u16 = 2;
    const NAME: &'static str = "SET_INFO response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        Ok(SetInfoResponse)
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueryDirectoryRequest<'a> {
    pub file_information_class: u8,
    pub flags: u8,
    pub file_index: u32,
    pub file_id: FileId,
    /// The search pattern, UTF-16LE.
    pub file_name: &'a [u8],
    pub output_buffer_length: u32,
}

impl QueryDirectoryRequest<'_> {
    pub fn pattern(&self) -> Result<String, DecodeError> {
        from_utf16le(self.file_name, "QUERY_DIRECTORY pattern")
    }
}

impl<'a> Message<'a> for QueryDirectoryRequest<'a> {
    const STRUCTURE_SIZE: u16 = 33;
    const NAME: &'static str = "QUERY_DIRECTORY request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let file_information_class = r.u8()?;
        let flags = r.u8()?;
        let file_index = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        let off = r.u16()? as usize;
        let len = r.u16()? as usize;
        let output_buffer_length = r.u32()?;
        Ok(QueryDirectoryRequest {
            file_information_class,
            flags,
            file_index,
            file_id,
            file_name: buffer(msg, off, len, r.pos(), Self::NAME)?,
            output_buffer_length,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_u16(out, Self::STRUCTURE_SIZE);
        out.push(self.file_information_class);
        out.push(self.flags);
        put_u32(out, self.file_index);
        self.file_id.write(out);
        put_u16(out, (here(out, start) + 8) as u16);
        put_u16(out, self.file_name.len() as u16);
        put_u32(out, self.output_buffer_length);
        if self.file_name.is_empty() {
            out.push(0);
        }
        out.extend_from_slice(self.file_name);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChangeNotifyRequest {
    pub flags: u16,
    pub output_buffer_length: u32,
    pub file_id: FileId,
    pub completion_filter: u32,
}

impl<'a> Message<'a> for ChangeNotifyRequest {
    const STRUCTURE_SIZE: u16 = 32;
    const NAME: &'static str = "CHANGE_NOTIFY request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let flags = r.u16()?;
        let output_buffer_length = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        let completion_filter = r.u32()?;
        r.u32()?;
        Ok(ChangeNotifyRequest {
            flags,
            output_buffer_length,
            file_id,
            completion_filter,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, self.flags);
        put_u32(out, self.output_buffer_length);
        self.file_id.write(out);
        put_u32(out, self.completion_filter);
        put_u32(out, 0);
    }
}
