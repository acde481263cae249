//! TREE_CONNECT (MS-SMB2 2.2.9, 2.2.10).

use super::{body, here, Message};
use crate::error::DecodeError;
use crate::wire::{buffer, from_utf16le, put_u16, put_u32};

pub const TREE_CONNECT_FLAG_EXTENSION_PRESENT: u16 = 0x0004;
pub const SHARE_TYPE_DISK: u8 = 0x01;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreeConnectRequest<'a> {
    pub flags: u16,
    /// The share path, UTF-16LE (`\\server\share`).
    pub path: &'a [u8],
}

impl TreeConnectRequest<'_> {
    pub fn path_string(&self) -> Result<String, DecodeError> {
        from_utf16le(self.path, "TREE_CONNECT path")
    }
}

impl<'a> Message<'a> for TreeConnectRequest<'a> {
    const STRUCTURE_SIZE: u16 = 9;
    const NAME: &'static str = "TREE_CONNECT request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let flags = r.u16()?;
        if flags & TREE_CONNECT_FLAG_EXTENSION_PRESENT != 0 {
            return Err(DecodeError::Invalid(
                "TREE_CONNECT extension is not supported",
            ));
        }
        let off = r.u16()? as usize;
        let len = r.u16()? as usize;
        let path = buffer(msg, off, len, r.pos(), Self::NAME)?;
        Ok(TreeConnectRequest { flags, path })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, self.flags);
        put_u16(out, (here(out, start) + 4) as u16);
        put_u16(out, self.path.len() as u16);
        out.extend_from_slice(self.path);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TreeConnectResponse {
    pub share_type: u8,
    pub share_flags: u32,
    pub capabilities: u32,
    pub maximal_access: u32,
}

impl<'a> Message<'a> for TreeConnectResponse {
    const STRUCTURE_SIZE: u16 = 16;
    const NAME: &'static str = "TREE_CONNECT response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let share_type = r.u8()?;
        r.u8()?;
        Ok(TreeConnectResponse {
            share_type,
            share_flags: r.u32()?,
            capabilities: r.u32()?,
            maximal_access: r.u32()?,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        out.push(self.share_type);
        out.push(0);
        put_u32(out, self.share_flags);
        put_u32(out, self.capabilities);
        put_u32(out, self.maximal_access);
    }
}
