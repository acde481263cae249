//! SESSION_SETUP (MS-SMB2 2.2.5, 2.2.6).

use super::{body, here, Message};
use crate::error::DecodeError;
use crate::wire::{buffer, patch_u16, put_u16, put_u32, put_u64};

/// SESSION_SETUP request flag: bind this connection to an existing session (multichannel).
pub const SESSION_FLAG_BINDING: u8 = 0x01;
/// SessionFlags of the response.
pub const SESSION_FLAG_IS_GUEST: u16 = 0x0001;
pub const SESSION_FLAG_IS_NULL: u16 = 0x0002;
pub const SESSION_FLAG_ENCRYPT_DATA: u16 = 0x0004;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionSetupRequest<'a> {
    pub flags: u8,
    pub security_mode: u8,
    pub capabilities: u32,
    pub channel: u32,
    pub previous_session_id: u64,
    /// The GSS token (SPNEGO or raw NTLMSSP).
    pub security_buffer: &'a [u8],
}

impl SessionSetupRequest<'_> {
    pub fn is_binding(&self) -> bool {
        self.flags & SESSION_FLAG_BINDING != 0
    }
}

impl<'a> Message<'a> for SessionSetupRequest<'a> {
    const STRUCTURE_SIZE: u16 = 25;
    const NAME: &'static str = "SESSION_SETUP request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let flags = r.u8()?;
        let security_mode = r.u8()?;
        let capabilities = r.u32()?;
        let channel = r.u32()?;
        let off = r.u16()? as usize;
        let len = r.u16()? as usize;
        let previous_session_id = r.u64()?;
        let security_buffer = buffer(msg, off, len, r.pos(), Self::NAME)?;
        Ok(SessionSetupRequest {
            flags,
            security_mode,
            capabilities,
            channel,
            previous_session_id,
            security_buffer,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_u16(out, Self::STRUCTURE_SIZE);
        out.push(self.flags);
        out.push(self.security_mode);
        put_u32(out, self.capabilities);
        put_u32(out, self.channel);
        let at = out.len();
        put_u16(out, 0);
        put_u16(out, self.security_buffer.len() as u16);
        put_u64(out, self.previous_session_id);
        let off = here(out, start) as u16;
        patch_u16(out, at, off);
        out.extend_from_slice(self.security_buffer);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionSetupResponse<'a> {
    pub session_flags: u16,
    pub security_buffer: &'a [u8],
}

impl<'a> Message<'a> for SessionSetupResponse<'a> {
    const STRUCTURE_SIZE: u16 = 9;
    const NAME: &'static str = "SESSION_SETUP response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let session_flags = r.u16()?;
        let off = r.u16()? as usize;
        let len = r.u16()? as usize;
        let security_buffer = buffer(msg, off, len, r.pos(), Self::NAME)?;
        Ok(SessionSetupResponse {
            session_flags,
            security_buffer,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, self.session_flags);
        put_u16(out, (here(out, start) + 4) as u16);
        put_u16(out, self.security_buffer.len() as u16);
        if self.security_buffer.is_empty() {
            out.push(0);
        }
        out.extend_from_slice(self.security_buffer);
    }
}
