//! NEGOTIATE (MS-SMB2 2.2.3, 2.2.4) and its negotiate contexts (2.2.3.1).

use super::{body, here, Message};
use crate::error::DecodeError;
use crate::wire::{
    buffer, from_utf16le, pad_to, patch_u16, patch_u32, put_u16, put_u32, put_u64, utf16le, Reader,
};

pub const DIALECT_202: u16 = 0x0202;
pub const DIALECT_210: u16 = 0x0210;
pub const DIALECT_300: u16 = 0x0300;
pub const DIALECT_302: u16 = 0x0302;
pub const DIALECT_311: u16 = 0x0311;
pub const DIALECT_WILDCARD: u16 = 0x02FF;

pub const SECURITY_SIGNING_ENABLED: u16 = 0x0001;
pub const SECURITY_SIGNING_REQUIRED: u16 = 0x0002;

pub const CAP_DFS: u32 = 0x01;
pub const CAP_LEASING: u32 = 0x02;
pub const CAP_LARGE_MTU: u32 = 0x04;
pub const CAP_MULTI_CHANNEL: u32 = 0x08;
pub const CAP_PERSISTENT_HANDLES: u32 = 0x10;
pub const CAP_DIRECTORY_LEASING: u32 = 0x20;
pub const CAP_ENCRYPTION: u32 = 0x40;

pub const CTX_PREAUTH_INTEGRITY: u16 = 0x0001;
pub const CTX_ENCRYPTION: u16 = 0x0002;
pub const CTX_COMPRESSION: u16 = 0x0003;
pub const CTX_NETNAME: u16 = 0x0005;
pub const CTX_TRANSPORT: u16 = 0x0006;
pub const CTX_RDMA_TRANSFORM: u16 = 0x0007;
pub const CTX_SIGNING: u16 = 0x0008;
pub const CTX_POSIX: u16 = 0x0100;

pub const HASH_SHA512: u16 = 0x0001;

/// One negotiate context. Those the server does not act on keep their raw data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NegotiateContext<'a> {
    PreauthIntegrity {
        hash_algorithms: Vec<u16>,
        salt: &'a [u8],
    },
    Encryption {
        ciphers: Vec<u16>,
    },
    Signing {
        algorithms: Vec<u16>,
    },
    NetName(String),
    /// The SMB3 POSIX extensions context: parsed for its size only and otherwise ignored.
    Posix(&'a [u8]),
    Other {
        context_type: u16,
        data: &'a [u8],
    },
}

fn u16_list(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<u16>, DecodeError> {
    let n = r.u16()?;
    if n == 0 {
        return Err(DecodeError::Invalid(what));
    }
    (0..n).map(|_| r.u16()).collect()
}

impl<'a> NegotiateContext<'a> {
    pub fn context_type(&self) -> u16 {
        match self {
            NegotiateContext::PreauthIntegrity { .. } => CTX_PREAUTH_INTEGRITY,
            NegotiateContext::Encryption { .. } => CTX_ENCRYPTION,
            NegotiateContext::Signing { .. } => CTX_SIGNING,
            NegotiateContext::NetName(_) => CTX_NETNAME,
            NegotiateContext::Posix(_) => CTX_POSIX,
            NegotiateContext::Other { context_type, .. } => *context_type,
        }
    }

    fn parse(context_type: u16, data: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(data, "negotiate context");
        Ok(match context_type {
            CTX_PREAUTH_INTEGRITY => {
                let count = r.u16()?;
                let salt_len = r.u16()? as usize;
                if count == 0 {
                    return Err(DecodeError::Invalid("preauth context lists no hash"));
                }
                let hash_algorithms = (0..count).map(|_| r.u16()).collect::<Result<_, _>>()?;
                NegotiateContext::PreauthIntegrity {
                    hash_algorithms,
                    salt: r.bytes(salt_len)?,
                }
            }
            CTX_ENCRYPTION => NegotiateContext::Encryption {
                ciphers: u16_list(&mut r, "encryption context lists no cipher")?,
            },
            CTX_SIGNING => NegotiateContext::Signing {
                algorithms: u16_list(&mut r, "signing context lists no algorithm")?,
            },
            CTX_NETNAME => NegotiateContext::NetName(from_utf16le(data, "netname context")?),
            CTX_POSIX => {
                if data.len() != 16 {
                    return Err(DecodeError::Invalid("POSIX context is not 16 bytes"));
                }
                NegotiateContext::Posix(data)
            }
            _ => NegotiateContext::Other { context_type, data },
        })
    }

    fn encode_data(&self, out: &mut Vec<u8>) {
        match self {
            NegotiateContext::PreauthIntegrity {
                hash_algorithms,
                salt,
            } => {
                put_u16(out, hash_algorithms.len() as u16);
                put_u16(out, salt.len() as u16);
                hash_algorithms.iter().for_each(|h| put_u16(out, *h));
                out.extend_from_slice(salt);
            }
            NegotiateContext::Encryption { ciphers: l }
            | NegotiateContext::Signing { algorithms: l } => {
                put_u16(out, l.len() as u16);
                l.iter().for_each(|c| put_u16(out, *c));
            }
            NegotiateContext::NetName(n) => out.extend_from_slice(&utf16le(n)),
            NegotiateContext::Posix(d) | NegotiateContext::Other { data: d, .. } => {
                out.extend_from_slice(d)
            }
        }
    }
}

/// Parses `count` contexts starting at `offset` (from the header start). Each is 8-aligned; a
/// second PREAUTH_INTEGRITY, ENCRYPTION, COMPRESSION or SIGNING context is an error
/// (MS-SMB2 3.3.5.4).
fn parse_contexts<'a>(
    msg: &'a [u8],
    offset: usize,
    count: u16,
) -> Result<Vec<NegotiateContext<'a>>, DecodeError> {
    let mut out: Vec<NegotiateContext<'a>> = Vec::new();
    let mut pos = offset;
    for i in 0..count {
        if i > 0 {
            pos = pos
                .checked_add(7)
                .ok_or(DecodeError::OutOfBounds("negotiate context"))?
                & !7;
        }
        if !pos.is_multiple_of(8) {
            return Err(DecodeError::Invalid(
                "negotiate context is not 8-byte aligned",
            ));
        }
        let mut r = Reader::at(msg, pos, "negotiate context");
        let ty = r.u16()?;
        let len = r.u16()? as usize;
        r.u32()?;
        let data = r.bytes(len)?;
        let ctx = NegotiateContext::parse(ty, data)?;
        let unique = [
            CTX_PREAUTH_INTEGRITY,
            CTX_ENCRYPTION,
            CTX_COMPRESSION,
            CTX_SIGNING,
        ];
        if unique.contains(&ty) && out.iter().any(|c| c.context_type() == ty) {
            return Err(DecodeError::Invalid("negotiate context repeated"));
        }
        out.push(ctx);
        pos = r.pos();
    }
    Ok(out)
}

fn encode_contexts(out: &mut Vec<u8>, body_start: usize, contexts: &[NegotiateContext<'_>]) {
    for (i, c) in contexts.iter().enumerate() {
        if i > 0 {
            pad_to(out, body_start, 8);
        }
        put_u16(out, c.context_type());
        let len_at = out.len();
        put_u16(out, 0);
        put_u32(out, 0);
        let data_start = out.len();
        c.encode_data(out);
        let len = (out.len() - data_start) as u16;
        patch_u16(out, len_at, len);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NegotiateRequest<'a> {
    pub security_mode: u16,
    pub capabilities: u32,
    pub client_guid: [u8; 16],
    pub dialects: Vec<u16>,
    /// Present only when 0x0311 is among the dialects.
    pub contexts: Vec<NegotiateContext<'a>>,
}

impl NegotiateRequest<'_> {
    pub fn offers_311(&self) -> bool {
        self.dialects.contains(&DIALECT_311)
    }
}

impl<'a> Message<'a> for NegotiateRequest<'a> {
    const STRUCTURE_SIZE: u16 = 36;
    const NAME: &'static str = "NEGOTIATE request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let count = r.u16()?;
        if count == 0 {
            return Err(DecodeError::Invalid("NEGOTIATE lists no dialect"));
        }
        let security_mode = r.u16()?;
        r.u16()?;
        let capabilities = r.u32()?;
        let client_guid = r.array()?;
        let ctx_offset = r.u32()? as usize;
        let ctx_count = r.u16()?;
        r.u16()?;
        let dialects: Vec<u16> = (0..count).map(|_| r.u16()).collect::<Result<_, _>>()?;
        let contexts = if dialects.contains(&DIALECT_311) && ctx_count > 0 {
            if ctx_offset < r.pos() {
                return Err(DecodeError::OutOfBounds("negotiate contexts"));
            }
            parse_contexts(msg, ctx_offset, ctx_count)?
        } else {
            Vec::new()
        };
        Ok(NegotiateRequest {
            security_mode,
            capabilities,
            client_guid,
            dialects,
            contexts,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, self.dialects.len() as u16);
        put_u16(out, self.security_mode);
        put_u16(out, 0);
        put_u32(out, self.capabilities);
        out.extend_from_slice(&self.client_guid);
        let off_at = out.len();
        put_u32(out, 0);
        put_u16(out, self.contexts.len() as u16);
        put_u16(out, 0);
        self.dialects.iter().for_each(|d| put_u16(out, *d));
        if !self.contexts.is_empty() {
            pad_to(out, start, 8);
            let off = here(out, start) as u32;
            patch_u32(out, off_at, off);
            encode_contexts(out, start, &self.contexts);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NegotiateResponse<'a> {
    pub security_mode: u16,
    pub dialect: u16,
    pub server_guid: [u8; 16],
    pub capabilities: u32,
    pub max_transact_size: u32,
    pub max_read_size: u32,
    pub max_write_size: u32,
    /// FILETIME, passed in by the caller.
    pub system_time: u64,
    pub server_start_time: u64,
    /// The SPNEGO hint token.
    pub security_buffer: &'a [u8],
    pub contexts: Vec<NegotiateContext<'a>>,
}

impl<'a> Message<'a> for NegotiateResponse<'a> {
    const STRUCTURE_SIZE: u16 = 65;
    const NAME: &'static str = "NEGOTIATE response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let security_mode = r.u16()?;
        let dialect = r.u16()?;
        let ctx_count = r.u16()?;
        let server_guid = r.array()?;
        let capabilities = r.u32()?;
        let max_transact_size = r.u32()?;
        let max_read_size = r.u32()?;
        let max_write_size = r.u32()?;
        let system_time = r.u64()?;
        let server_start_time = r.u64()?;
        let sec_off = r.u16()? as usize;
        let sec_len = r.u16()? as usize;
        let ctx_offset = r.u32()? as usize;
        let security_buffer = buffer(msg, sec_off, sec_len, r.pos(), Self::NAME)?;
        let contexts = if dialect == DIALECT_311 && ctx_count > 0 {
            if ctx_offset < r.pos() {
                return Err(DecodeError::OutOfBounds("negotiate contexts"));
            }
            parse_contexts(msg, ctx_offset, ctx_count)?
        } else {
            Vec::new()
        };
        Ok(NegotiateResponse {
            security_mode,
            dialect,
            server_guid,
            capabilities,
            max_transact_size,
            max_read_size,
            max_write_size,
            system_time,
            server_start_time,
            security_buffer,
            contexts,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, self.security_mode);
        put_u16(out, self.dialect);
        put_u16(out, self.contexts.len() as u16);
        out.extend_from_slice(&self.server_guid);
        put_u32(out, self.capabilities);
        put_u32(out, self.max_transact_size);
        put_u32(out, self.max_read_size);
        put_u32(out, self.max_write_size);
        put_u64(out, self.system_time);
        put_u64(out, self.server_start_time);
        put_u16(out, (here(out, start) + 8) as u16);
        put_u16(out, self.security_buffer.len() as u16);
        let ctx_at = out.len();
        put_u32(out, 0);
        out.extend_from_slice(self.security_buffer);
        if self.contexts.is_empty() {
            if self.security_buffer.is_empty() {
                out.push(0);
            }
            return;
        }
        pad_to(out, start, 8);
        let off = here(out, start) as u32;
        patch_u32(out, ctx_at, off);
        encode_contexts(out, start, &self.contexts);
    }
}
