//! IOCTL (MS-SMB2 2.2.31, 2.2.32) and the FSCTL_VALIDATE_NEGOTIATE_INFO input (2.2.31.4).

use super::{body, FileId, Message};
use crate::error::DecodeError;
use crate::header::HEADER_LEN;
use crate::wire::{buffer, put_u16, put_u32, Reader};

pub const FSCTL_VALIDATE_NEGOTIATE_INFO: u32 = 0x0014_0204;
pub const FSCTL_QUERY_NETWORK_INTERFACE_INFO: u32 = 0x0014_01FC;
pub const FSCTL_DFS_GET_REFERRALS: u32 = 0x0006_0194;
pub const SMB2_0_IOCTL_IS_FSCTL: u32 = 0x0000_0001;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IoctlRequest<'a> {
    pub ctl_code: u32,
    pub file_id: FileId,
    pub input: &'a [u8],
    pub max_input_response: u32,
    pub output: &'a [u8],
    pub max_output_response: u32,
    pub flags: u32,
}

impl<'a> Message<'a> for IoctlRequest<'a> {
    const STRUCTURE_SIZE: u16 = 57;
    const NAME: &'static str = "IOCTL request";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        r.u16()?;
        let ctl_code = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        let in_off = r.u32()? as usize;
        let in_len = r.u32()? as usize;
        let max_input_response = r.u32()?;
        let out_off = r.u32()? as usize;
        let out_len = r.u32()? as usize;
        let max_output_response = r.u32()?;
        let flags = r.u32()?;
        r.u32()?;
        Ok(IoctlRequest {
            ctl_code,
            file_id,
            input: buffer(msg, in_off, in_len, r.pos(), Self::NAME)?,
            max_input_response,
            output: buffer(msg, out_off, out_len, r.pos(), Self::NAME)?,
            max_output_response,
            flags,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let in_off = (HEADER_LEN + 56) as u32;
        let out_off = in_off + self.input.len() as u32;
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, 0);
        put_u32(out, self.ctl_code);
        self.file_id.write(out);
        put_u32(out, if self.input.is_empty() { 0 } else { in_off });
        put_u32(out, self.input.len() as u32);
        put_u32(out, self.max_input_response);
        put_u32(out, if self.output.is_empty() { 0 } else { out_off });
        put_u32(out, self.output.len() as u32);
        put_u32(out, self.max_output_response);
        put_u32(out, self.flags);
        put_u32(out, 0);
        out.extend_from_slice(self.input);
        out.extend_from_slice(self.output);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IoctlResponse<'a> {
    pub ctl_code: u32,
    pub file_id: FileId,
    pub input: &'a [u8],
    pub output: &'a [u8],
    pub flags: u32,
}

impl<'a> Message<'a> for IoctlResponse<'a> {
    const STRUCTURE_SIZE: u16 = 49;
    const NAME: &'static str = "IOCTL response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        r.u16()?;
        let ctl_code = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        let in_off = r.u32()? as usize;
        let in_len = r.u32()? as usize;
        let out_off = r.u32()? as usize;
        let out_len = r.u32()? as usize;
        let flags = r.u32()?;
        r.u32()?;
        Ok(IoctlResponse {
            ctl_code,
            file_id,
            input: buffer(msg, in_off, in_len, r.pos(), Self::NAME)?,
            output: buffer(msg, out_off, out_len, r.pos(), Self::NAME)?,
            flags,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        let in_off = (HEADER_LEN + 48) as u32;
        let out_off = in_off + self.input.len() as u32;
        put_u16(out, Self::STRUCTURE_SIZE);
        put_u16(out, 0);
        put_u32(out, self.ctl_code);
        self.file_id.write(out);
        put_u32(out, in_off);
        put_u32(out, self.input.len() as u32);
        put_u32(out, out_off);
        put_u32(out, self.output.len() as u32);
        put_u32(out, self.flags);
        put_u32(out, 0);
        out.extend_from_slice(self.input);
        out.extend_from_slice(self.output);
    }
}

/// The VALIDATE_NEGOTIATE_INFO request (MS-SMB2 2.2.31.4), compared by the server with what
/// the connection negotiated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ValidateNegotiateInfo {
    pub capabilities: u32,
    pub guid: [u8; 16],
    pub security_mode: u16,
    pub dialects: Vec<u16>,
}

impl ValidateNegotiateInfo {
    pub fn decode(input: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(input, "VALIDATE_NEGOTIATE_INFO");
        let capabilities = r.u32()?;
        let guid = r.array()?;
        let security_mode = r.u16()?;
        let count = r.u16()?;
        let dialects = (0..count).map(|_| r.u16()).collect::<Result<_, _>>()?;
        Ok(ValidateNegotiateInfo {
            capabilities,
            guid,
            security_mode,
            dialects,
        })
    }
}

/// The VALIDATE_NEGOTIATE_INFO response (MS-SMB2 2.2.32.6).
pub fn encode_validate_negotiate_response(
    capabilities: u32,
    guid: [u8; 16],
    security_mode: u16,
    dialect: u16,
    out: &mut Vec<u8>,
) {
    put_u32(out, capabilities);
    out.extend_from_slice(&guid);
    put_u16(out, security_mode);
    put_u16(out, dialect);
}

pub const NETWORK_INTERFACE_CAP_RSS: u32 = 0x1;
pub const NETWORK_INTERFACE_CAP_RDMA: u32 = 0x2;

/// One entry of the FSCTL_QUERY_NETWORK_INTERFACE_INFO answer (MS-SMB2 2.2.32.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkInterface {
    pub if_index: u32,
    pub capability: u32,
    /// Bits per second.
    pub link_speed: u64,
    pub address: std::net::IpAddr,
}

const NETWORK_INTERFACE_LEN: usize = 152;

/// Encodes the list, each entry 152 bytes with its Next offset (0 for the last).
pub fn encode_network_interfaces(list: &[NetworkInterface], out: &mut Vec<u8>) {
    for (i, nic) in list.iter().enumerate() {
        let start = out.len();
        let next = if i + 1 == list.len() {
            0
        } else {
            NETWORK_INTERFACE_LEN as u32
        };
        put_u32(out, next);
        put_u32(out, nic.if_index);
        put_u32(out, nic.capability);
        put_u32(out, 0);
        crate::wire::put_u64(out, nic.link_speed);
        match nic.address {
            std::net::IpAddr::V4(a) => {
                put_u16(out, 0x0002);
                put_u16(out, 0);
                out.extend_from_slice(&a.octets());
            }
            std::net::IpAddr::V6(a) => {
                put_u16(out, 0x0017);
                put_u16(out, 0);
                put_u32(out, 0);
                out.extend_from_slice(&a.octets());
                put_u32(out, 0);
            }
        }
        out.resize(start + NETWORK_INTERFACE_LEN, 0);
    }
}

/// Decodes such a list, following Next offsets strictly forward inside `buf`.
pub fn decode_network_interfaces(buf: &[u8]) -> Result<Vec<NetworkInterface>, DecodeError> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    loop {
        let entry = crate::wire::slice(buf, pos, NETWORK_INTERFACE_LEN, "NETWORK_INTERFACE_INFO")?;
        let mut r = Reader::new(entry, "NETWORK_INTERFACE_INFO");
        let next = r.u32()? as usize;
        let if_index = r.u32()?;
        let capability = r.u32()?;
        r.u32()?;
        let link_speed = r.u64()?;
        let address = match r.u16()? {
            0x0002 => {
                r.u16()?;
                std::net::IpAddr::from(r.array::<4>()?)
            }
            0x0017 => {
                r.u16()?;
                r.u32()?;
                std::net::IpAddr::from(r.array::<16>()?)
            }
            _ => return Err(DecodeError::Invalid("unknown address family")),
        };
        out.push(NetworkInterface {
            if_index,
            capability,
            link_speed,
            address,
        });
        if next == 0 {
            return Ok(out);
        }
        if next < NETWORK_INTERFACE_LEN {
            return Err(DecodeError::Invalid("NETWORK_INTERFACE_INFO Next overlaps"));
        }
        pos += next;
    }
}
