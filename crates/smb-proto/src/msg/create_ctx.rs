//! Typed bodies of the create contexts the server acts on (MS-SMB2 2.2.13.2, 2.2.14.2): lease
//! requests v1 and v2, durable handles v1 and v2, maximal access, on-disk id, allocation size,
//! timewarp. Each decodes from `CreateContext::data` and encodes a response context's data.

use super::FileId;
use crate::error::DecodeError;
use crate::wire::{put_u16, put_u32, put_u64, Reader};

pub const DH2_FLAG_PERSISTENT: u32 = 0x0000_0002;
pub const LEASE_FLAG_BREAK_IN_PROGRESS: u32 = 0x0000_0002;
pub const LEASE_FLAG_PARENT_LEASE_KEY_SET: u32 = 0x0000_0004;

/// RqLs: SMB2_CREATE_REQUEST_LEASE (32 bytes) or SMB2_CREATE_REQUEST_LEASE_V2 (52 bytes); the
/// response context has the same layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    V1 {
        key: [u8; 16],
        state: u32,
        flags: u32,
    },
    V2 {
        key: [u8; 16],
        state: u32,
        flags: u32,
        parent_key: [u8; 16],
        epoch: u16,
    },
}

impl Lease {
    pub fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(data, "RqLs");
        let key = r.array()?;
        let state = r.u32()?;
        let flags = r.u32()?;
        r.u64()?;
        match data.len() {
            32 => Ok(Lease::V1 { key, state, flags }),
            52 => {
                let parent_key = r.array()?;
                let epoch = r.u16()?;
                Ok(Lease::V2 {
                    key,
                    state,
                    flags,
                    parent_key,
                    epoch,
                })
            }
            _ => Err(DecodeError::Invalid("RqLs is neither 32 nor 52 bytes")),
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Lease::V1 { key, state, flags } => {
                out.extend_from_slice(key);
                put_u32(out, *state);
                put_u32(out, *flags);
                put_u64(out, 0);
            }
            Lease::V2 {
                key,
                state,
                flags,
                parent_key,
                epoch,
            } => {
                out.extend_from_slice(key);
                put_u32(out, *state);
                put_u32(out, *flags);
                put_u64(out, 0);
                out.extend_from_slice(parent_key);
                put_u16(out, *epoch);
                put_u16(out, 0);
            }
        }
    }

    pub fn key(&self) -> [u8; 16] {
        match self {
            Lease::V1 { key, .. } | Lease::V2 { key, .. } => *key,
        }
    }
}

/// DH2Q request (32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableRequestV2 {
    pub timeout: u32,
    pub flags: u32,
    pub create_guid: [u8; 16],
}

impl DurableRequestV2 {
    pub fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        if data.len() != 32 {
            return Err(DecodeError::Invalid("DH2Q is not 32 bytes"));
        }
        let mut r = Reader::new(data, "DH2Q");
        let timeout = r.u32()?;
        let flags = r.u32()?;
        r.u64()?;
        Ok(DurableRequestV2 {
            timeout,
            flags,
            create_guid: r.array()?,
        })
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.timeout);
        put_u32(out, self.flags);
        put_u64(out, 0);
        out.extend_from_slice(&self.create_guid);
    }
    pub fn is_persistent(&self) -> bool {
        self.flags & DH2_FLAG_PERSISTENT != 0
    }
    /// The DH2Q response data: Timeout and Flags (8 bytes).
    pub fn encode_response(timeout: u32, flags: u32, out: &mut Vec<u8>) {
        put_u32(out, timeout);
        put_u32(out, flags);
    }
}

/// DH2C request (36 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableReconnectV2 {
    pub file_id: FileId,
    pub create_guid: [u8; 16],
    pub flags: u32,
}

impl DurableReconnectV2 {
    pub fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        if data.len() != 36 {
            return Err(DecodeError::Invalid("DH2C is not 36 bytes"));
        }
        let mut r = Reader::new(data, "DH2C");
        Ok(DurableReconnectV2 {
            file_id: FileId::read(&mut r)?,
            create_guid: r.array()?,
            flags: r.u32()?,
        })
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.file_id.write(out);
        out.extend_from_slice(&self.create_guid);
        put_u32(out, self.flags);
    }
}

/// DH2Q response (8 bytes): the timeout the server keeps the handle for, in milliseconds, and
/// the flags it granted (PERSISTENT or none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableResponseV2 {
    pub timeout: u32,
    pub flags: u32,
}

impl DurableResponseV2 {
    pub fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        if data.len() != 8 {
            return Err(DecodeError::Invalid("DH2Q response is not 8 bytes"));
        }
        let mut r = Reader::new(data, "DH2Q response");
        Ok(DurableResponseV2 {
            timeout: r.u32()?,
            flags: r.u32()?,
        })
    }
    pub fn encode(&self, out: &mut Vec<u8>) {
        DurableRequestV2::encode_response(self.timeout, self.flags, out);
    }
}

/// DHnQ request: 16 reserved bytes (MS-SMB2 2.2.13.2.3); anything else is malformed.
pub fn decode_durable_request_v1(data: &[u8]) -> Result<(), DecodeError> {
    if data.len() != 16 {
        return Err(DecodeError::Invalid("DHnQ is not 16 bytes"));
    }
    Ok(())
}

/// DHnQ response data: 8 reserved bytes (MS-SMB2 2.2.14.2.3).
pub fn encode_durable_response_v1(out: &mut Vec<u8>) {
    put_u64(out, 0);
}

/// SMB2_CREATE_APP_INSTANCE_ID request (20 bytes: StructureSize 20, Reserved, the GUID).
pub fn decode_app_instance_id(data: &[u8]) -> Result<[u8; 16], DecodeError> {
    if data.len() != 20 {
        return Err(DecodeError::Invalid("AppInstanceId is not 20 bytes"));
    }
    let mut r = Reader::new(data, "AppInstanceId");
    if r.u16()? != 20 {
        return Err(DecodeError::Invalid(
            "AppInstanceId StructureSize is not 20",
        ));
    }
    r.u16()?;
    r.array()
}

/// The AppInstanceId context's data.
pub fn encode_app_instance_id(id: &[u8; 16], out: &mut Vec<u8>) {
    put_u16(out, 20);
    put_u16(out, 0);
    out.extend_from_slice(id);
}

/// DHnC request: the FileId to reconnect (16 bytes).
pub fn decode_durable_reconnect_v1(data: &[u8]) -> Result<FileId, DecodeError> {
    if data.len() != 16 {
        return Err(DecodeError::Invalid("DHnC is not 16 bytes"));
    }
    FileId::read(&mut Reader::new(data, "DHnC"))
}

/// MxAc request: empty, or a timestamp (8 bytes).
pub fn decode_maximal_access_request(data: &[u8]) -> Result<Option<u64>, DecodeError> {
    match data.len() {
        0 => Ok(None),
        8 => Ok(Some(Reader::new(data, "MxAc").u64()?)),
        _ => Err(DecodeError::Invalid("MxAc is neither 0 nor 8 bytes")),
    }
}

/// MxAc response data: QueryStatus and MaximalAccess.
pub fn encode_maximal_access_response(status: u32, access: u32, out: &mut Vec<u8>) {
    put_u32(out, status);
    put_u32(out, access);
}

/// QFid response data: DiskFileId (16), VolumeId (8), Reserved (8).
pub fn encode_on_disk_id_response(disk_file_id: [u8; 16], volume_id: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&disk_file_id);
    put_u64(out, volume_id);
    put_u64(out, 0);
}

/// AlSi and TWrp requests: one 64-bit value.
pub fn decode_u64_context(data: &[u8]) -> Result<u64, DecodeError> {
    if data.len() != 8 {
        return Err(DecodeError::Invalid("context is not 8 bytes"));
    }
    Reader::new(data, "create context").u64()
}
