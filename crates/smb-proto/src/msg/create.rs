//! CREATE and CLOSE (MS-SMB2 2.2.13 to 2.2.16) and the generic create-context list
//! (2.2.13.2), from which the server picks RqLs, DH2Q, MxAc, QFid and the rest by name.

use super::{body, here, FileId, Message};
use crate::error::DecodeError;
use crate::wire::{
    buffer, from_utf16le, pad_to, patch_u16, patch_u32, put_u16, put_u32, put_u64, Reader,
};

pub const CTX_REQUEST_LEASE: &[u8] = b"RqLs";
pub const CTX_DURABLE_HANDLE_REQUEST_V2: &[u8] = b"DH2Q";
pub const CTX_DURABLE_HANDLE_RECONNECT_V2: &[u8] = b"DH2C";
pub const CTX_DURABLE_HANDLE_REQUEST: &[u8] = b"DHnQ";
pub const CTX_DURABLE_HANDLE_RECONNECT: &[u8] = b"DHnC";
pub const CTX_QUERY_MAXIMAL_ACCESS: &[u8] = b"MxAc";
pub const CTX_QUERY_ON_DISK_ID: &[u8] = b"QFid";
pub const CTX_TIMEWARP: &[u8] = b"TWrp";
pub const CTX_ALLOCATION_SIZE: &[u8] = b"AlSi";
/// SMB2_CREATE_APP_INSTANCE_ID: a 16-byte GUID name (MS-SMB2 2.2.13.2).
pub const CTX_APP_INSTANCE_ID: &[u8] = &[
    0x45, 0xBC, 0xA6, 0x6A, 0xEF, 0xA7, 0xF7, 0x4A, 0x90, 0x08, 0xFA, 0x46, 0x2E, 0x14, 0x4D, 0x74,
];

/// One create context: its name and data, both borrowed from the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateContext<'a> {
    pub name: &'a [u8],
    pub data: &'a [u8],
}

/// Parses a create-context chain. Every Next is 8-aligned and stays inside the list; names and
/// data lie inside their own context.
pub fn parse_create_contexts(list: &[u8]) -> Result<Vec<CreateContext<'_>>, DecodeError> {
    const WHAT: &str = "create context";
    let mut out = Vec::new();
    let mut pos = 0usize;
    loop {
        let ctx = list.get(pos..).ok_or(DecodeError::OutOfBounds(WHAT))?;
        let mut r = Reader::new(ctx, WHAT);
        let next = r.u32()? as usize;
        let name_off = r.u16()? as usize;
        let name_len = r.u16()? as usize;
        r.u16()?;
        let data_off = r.u16()? as usize;
        let data_len = r.u32()? as usize;
        let own = if next == 0 {
            ctx
        } else {
            if !next.is_multiple_of(8) || next < 16 {
                return Err(DecodeError::Invalid("create context Next is malformed"));
            }
            ctx.get(..next).ok_or(DecodeError::OutOfBounds(WHAT))?
        };
        if name_len == 0 {
            return Err(DecodeError::Invalid("create context has no name"));
        }
        let name = buffer(own, name_off, name_len, 16, WHAT)?;
        let data = buffer(own, data_off, data_len, 16, WHAT)?;
        out.push(CreateContext { name, data });
        if next == 0 {
            return Ok(out);
        }
        pos += next;
    }
}

/// Appends a create-context chain, each context 8-aligned.
pub fn encode_create_contexts(out: &mut Vec<u8>, contexts: &[CreateContext<'_>]) {
    let mut prev: Option<usize> = None;
    for c in contexts {
        if let Some(p) = prev {
            pad_to(out, p, 8);
            let next = (out.len() - p) as u32;
            patch_u32(out, p, next);
        }
        let start = out.len();
        put_u32(out, 0);
        put_u16(out, 16);
        put_u16(out, c.name.len() as u16);
        put_u16(out, 0);
        put_u16(out, 0);
        put_u32(out, c.data.len() as u32);
        out.extend_from_slice(c.name);
        if !c.data.is_empty() {
            pad_to(out, start, 8);
            let off = (out.len() - start) as u16;
            patch_u16(out, start + 10, off);
            out.extend_from_slice(c.data);
        }
        prev = Some(start);
    }
}

fn contexts_at<'a>(
    msg: &'a [u8],
    off: usize,
    len: usize,
    min: usize,
) -> Result<Vec<CreateContext<'a>>, DecodeError> {
    if len == 0 {
        return Ok(Vec::new());
    }
    if !off.is_multiple_of(8) {
        return Err(DecodeError::Invalid(
            "create contexts are not 8-byte aligned",
        ));
    }
    parse_create_contexts(buffer(msg, off, len, min, "create contexts")?)
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CreateRequest<'a> {
    pub security_flags: u8,
    pub requested_oplock_level: u8,
    pub impersonation_level: u32,
    pub smb_create_flags: u64,
    pub desired_access: u32,
    pub file_attributes: u32,
    pub share_access: u32,
    pub create_disposition: u32,
    pub create_options: u32,
    /// The path relative to the share, UTF-16LE.
    pub name: &'a [u8],
    pub contexts: Vec<CreateContext<'a>>,
}

impl CreateRequest<'_> {
    pub fn name_string(&self) -> Result<String, DecodeError> {
        from_utf16le(self.name, "CREATE name")
    }
    pub fn context(&self, name: &[u8]) -> Option<&CreateContext<'_>> {
        self.contexts.iter().find(|c| c.name == name)
    }
}

impl<'a> Message<'a> for CreateRequest<'a> {
    const STRUCTURE_SIZE: u16 = 57;
    const NAME: &'static str = "CREATE request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let security_flags = r.u8()?;
        let requested_oplock_level = r.u8()?;
        let impersonation_level = r.u32()?;
        let smb_create_flags = r.u64()?;
        r.u64()?;
        let desired_access = r.u32()?;
        let file_attributes = r.u32()?;
        let share_access = r.u32()?;
        let create_disposition = r.u32()?;
        let create_options = r.u32()?;
        let name_off = r.u16()? as usize;
        let name_len = r.u16()? as usize;
        let ctx_off = r.u32()? as usize;
        let ctx_len = r.u32()? as usize;
        if !name_len.is_multiple_of(2) {
            return Err(DecodeError::Invalid("CREATE name length is odd"));
        }
        let name = buffer(msg, name_off, name_len, r.pos(), Self::NAME)?;
        let contexts = contexts_at(msg, ctx_off, ctx_len, r.pos())?;
        Ok(CreateRequest {
            security_flags,
            requested_oplock_level,
            impersonation_level,
            smb_create_flags,
            desired_access,
            file_attributes,
            share_access,
            create_disposition,
            create_options,
            name,
            contexts,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_u16(out, Self::STRUCTURE_SIZE);
        out.push(self.security_flags);
        out.push(self.requested_oplock_level);
        put_u32(out, self.impersonation_level);
        put_u64(out, self.smb_create_flags);
        put_u64(out, 0);
        put_u32(out, self.desired_access);
        put_u32(out, self.file_attributes);
        put_u32(out, self.share_access);
        put_u32(out, self.create_disposition);
        put_u32(out, self.create_options);
        let fields = out.len();
        put_u16(out, (here(out, start) + 12) as u16);
        put_u16(out, self.name.len() as u16);
        put_u32(out, 0);
        put_u32(out, 0);
        out.extend_from_slice(self.name);
        if self.name.is_empty() && self.contexts.is_empty() {
            out.push(0);
        }
        if !self.contexts.is_empty() {
            pad_to(out, start, 8);
            let off = here(out, start) as u32;
            let ctx_start = out.len();
            encode_create_contexts(out, &self.contexts);
            let len = (out.len() - ctx_start) as u32;
            patch_u32(out, fields + 4, off);
            patch_u32(out, fields + 8, len);
        }
    }
}

/// The four FILETIMEs of CREATE and CLOSE responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileTimes {
    pub creation: u64,
    pub last_access: u64,
    pub last_write: u64,
    pub change: u64,
}

impl FileTimes {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(FileTimes {
            creation: r.u64()?,
            last_access: r.u64()?,
            last_write: r.u64()?,
            change: r.u64()?,
        })
    }
    fn write(&self, out: &mut Vec<u8>) {
        for t in [
            self.creation,
            self.last_access,
            self.last_write,
            self.change,
        ] {
            put_u64(out, t);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CreateResponse<'a> {
    pub oplock_level: u8,
    pub flags: u8,
    pub create_action: u32,
    pub times: FileTimes,
    pub allocation_size: u64,
    pub end_of_file: u64,
    pub file_attributes: u32,
    pub file_id: FileId,
    pub contexts: Vec<CreateContext<'a>>,
}

impl<'a> Message<'a> for CreateResponse<'a> {
    const STRUCTURE_SIZE: u16 = 89;
    const NAME: &'static str = "CREATE response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let oplock_level = r.u8()?;
        let flags = r.u8()?;
        let create_action = r.u32()?;
        let times = FileTimes::read(&mut r)?;
        let allocation_size = r.u64()?;
        let end_of_file = r.u64()?;
        let file_attributes = r.u32()?;
        r.u32()?;
        let file_id = FileId::read(&mut r)?;
        let ctx_off = r.u32()? as usize;
        let ctx_len = r.u32()? as usize;
        let contexts = contexts_at(msg, ctx_off, ctx_len, r.pos())?;
        Ok(CreateResponse {
            oplock_level,
            flags,
            create_action,
            times,
            allocation_size,
            end_of_file,
            file_attributes,
            file_id,
            contexts,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_u16(out, Self::STRUCTURE_SIZE);
        out.push(self.oplock_level);
        out.push(self.flags);
        put_u32(out, self.create_action);
        self.times.write(out);
        put_u64(out, self.allocation_size);
        put_u64(out, self.end_of_file);
        put_u32(out, self.file_attributes);
        put_u32(out, 0);
        self.file_id.write(out);
        let fields = out.len();
        put_u32(out, 0);
        put_u32(out, 0);
        // Without contexts the body ends after its 88 fixed bytes, as smbd sends it.
        if self.contexts.is_empty() {
            return;
        }
        pad_to(out, start, 8);
        let off = here(out, start) as u32;
        let ctx_start = out.len();
        encode_create_contexts(out, &self.contexts);
        let len = (out.len() - ctx_start) as u32;
        patch_u32(out, fields, off);
        patch_u32(out, fields + 4, len);
    }
}

pub const CLOSE_FLAG_POSTQUERY_ATTRIB: u16 = 0x0001;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CloseRequest {
    pub flags: u16,
    pub file_id: FileId,
}

impl<'a> Message<'a> for CloseRequest {
    const STRUCTURE_SIZE: u16 = 24;
    const NAME: &'static str = "CLOSE request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let flags = r.u16()?;
        r.u32()?;
        Ok(CloseRequest {
            flags,
            file_id: FileId::read(&mut r)?,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, self.flags);
        put_u32(out, 0);
        self.file_id.write(out);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CloseResponse {
    pub flags: u16,
    pub times: FileTimes,
    pub allocation_size: u64,
    pub end_of_file: u64,
    pub file_attributes: u32,
}

impl<'a> Message<'a> for CloseResponse {
    const STRUCTURE_SIZE: u16 = 60;
    const NAME: &'static str = "CLOSE response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let flags = r.u16()?;
        r.u32()?;
        Ok(CloseResponse {
            flags,
            times: FileTimes::read(&mut r)?,
            allocation_size: r.u64()?,
            end_of_file: r.u64()?,
            file_attributes: r.u32()?,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, self.flags);
        put_u32(out, 0);
        self.times.write(out);
        put_u64(out, self.allocation_size);
        put_u64(out, self.end_of_file);
        put_u32(out, self.file_attributes);
    }
}
