//! NTLM messages (MS-NLMP 2.2), each one type that encodes and decodes: the server parses
//! NEGOTIATE and AUTHENTICATE and builds CHALLENGE; the client does the reverse.

use crate::error::DecodeError;
use crate::wire::{from_utf16le, put_u16, put_u32, utf16le, Reader};

pub const SIGNATURE: &[u8; 8] = b"NTLMSSP\0";

pub mod flags {
    pub const UNICODE: u32 = 0x0000_0001;
    pub const OEM: u32 = 0x0000_0002;
    pub const REQUEST_TARGET: u32 = 0x0000_0004;
    pub const SIGN: u32 = 0x0000_0010;
    pub const SEAL: u32 = 0x0000_0020;
    pub const LM_KEY: u32 = 0x0000_0080;
    pub const NTLM: u32 = 0x0000_0200;
    pub const ANONYMOUS: u32 = 0x0000_0800;
    pub const ALWAYS_SIGN: u32 = 0x0000_8000;
    pub const TARGET_TYPE_DOMAIN: u32 = 0x0001_0000;
    pub const TARGET_TYPE_SERVER: u32 = 0x0002_0000;
    pub const EXTENDED_SESSIONSECURITY: u32 = 0x0008_0000;
    pub const TARGET_INFO: u32 = 0x0080_0000;
    pub const VERSION: u32 = 0x0200_0000;
    pub const NEG_128: u32 = 0x2000_0000;
    pub const KEY_EXCH: u32 = 0x4000_0000;
    pub const NEG_56: u32 = 0x8000_0000;
}

/// AV pair ids (MS-NLMP 2.2.2.1).
pub mod av {
    pub const EOL: u16 = 0;
    pub const NB_COMPUTER_NAME: u16 = 1;
    pub const NB_DOMAIN_NAME: u16 = 2;
    pub const DNS_COMPUTER_NAME: u16 = 3;
    pub const DNS_DOMAIN_NAME: u16 = 4;
    pub const DNS_TREE_NAME: u16 = 5;
    pub const FLAGS: u16 = 6;
    pub const TIMESTAMP: u16 = 7;
    pub const TARGET_NAME: u16 = 9;
    pub const CHANNEL_BINDINGS: u16 = 10;
    /// MsvAvFlags bit: the AUTHENTICATE message carries a MIC.
    pub const FLAG_MIC_PRESENT: u32 = 0x2;
}

/// One AV pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AvPair {
    pub id: u16,
    pub value: Vec<u8>,
}

impl AvPair {
    pub fn name(id: u16, name: &str) -> Self {
        AvPair {
            id,
            value: utf16le(name),
        }
    }
    pub fn timestamp(filetime: u64) -> Self {
        AvPair {
            id: av::TIMESTAMP,
            value: filetime.to_le_bytes().to_vec(),
        }
    }
}

/// Parses an AV pair list up to MsvAvEOL.
pub fn parse_av_pairs(mut buf: &[u8]) -> Result<Vec<AvPair>, DecodeError> {
    let mut out = Vec::new();
    loop {
        let mut r = Reader::new(buf, "AV pair");
        let id = r.u16()?;
        let len = r.u16()? as usize;
        let value = r.bytes(len)?;
        if id == av::EOL {
            return Ok(out);
        }
        out.push(AvPair {
            id,
            value: value.to_vec(),
        });
        buf = buf.get(4 + len..).unwrap_or(&[]);
    }
}

pub fn encode_av_pairs(pairs: &[AvPair], out: &mut Vec<u8>) {
    for p in pairs.iter().filter(|p| p.id != av::EOL) {
        put_u16(out, p.id);
        put_u16(out, p.value.len() as u16);
        out.extend_from_slice(&p.value);
    }
    put_u32(out, 0);
}

fn header(buf: &[u8], ty: u32) -> Result<Reader<'_>, DecodeError> {
    let mut r = Reader::new(buf, "NTLM message");
    if &r.array::<8>()? != SIGNATURE {
        return Err(DecodeError::Invalid("not an NTLMSSP message"));
    }
    if r.u32()? != ty {
        return Err(DecodeError::Invalid("unexpected NTLM message type"));
    }
    Ok(r)
}

/// The type of an NTLMSSP message, if `buf` is one.
pub fn message_type(buf: &[u8]) -> Option<u32> {
    let sig = buf.get(..8)?;
    if sig != SIGNATURE {
        return None;
    }
    Some(u32::from_le_bytes(buf.get(8..12)?.try_into().ok()?))
}

/// A (Len, MaxLen, Offset) field; returns the bytes and the offset.
fn field<'a>(msg: &'a [u8], r: &mut Reader<'_>) -> Result<(&'a [u8], usize), DecodeError> {
    let len = r.u16()? as usize;
    r.u16()?;
    let off = r.u32()? as usize;
    if len == 0 {
        return Ok((&[], usize::MAX));
    }
    Ok((crate::wire::slice(msg, off, len, "NTLM field")?, off))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegotiateMessage<'a> {
    pub flags: u32,
    pub domain: &'a [u8],
    pub workstation: &'a [u8],
}

impl<'a> NegotiateMessage<'a> {
    pub fn decode(buf: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = header(buf, 1)?;
        let flags = r.u32()?;
        let (domain, _) = field(buf, &mut r)?;
        let (workstation, _) = field(buf, &mut r)?;
        Ok(NegotiateMessage {
            flags,
            domain,
            workstation,
        })
    }

    /// The message with an 8-byte VERSION after the fixed fields (MS-NLMP 2.2.1.1); the domain
    /// and workstation are sent only when non-empty (OEM bytes, as the spec has them).
    pub fn encode(&self, version: [u8; 8]) -> Vec<u8> {
        let base = 40u32;
        let mut out = Vec::with_capacity(40 + self.domain.len() + self.workstation.len());
        out.extend_from_slice(SIGNATURE);
        put_u32(&mut out, 1);
        put_u32(&mut out, self.flags);
        let mut at = base;
        for f in [self.domain, self.workstation] {
            put_u16(&mut out, f.len() as u16);
            put_u16(&mut out, f.len() as u16);
            put_u32(&mut out, if f.is_empty() { 0 } else { at });
            at += f.len() as u32;
        }
        out.extend_from_slice(&version);
        out.extend_from_slice(self.domain);
        out.extend_from_slice(self.workstation);
        out
    }
}

/// A CHALLENGE message to send. `version` is the 8-byte VERSION structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChallengeMessage {
    pub target_name: String,
    pub flags: u32,
    pub server_challenge: [u8; 8],
    pub target_info: Vec<AvPair>,
    pub version: [u8; 8],
}

impl ChallengeMessage {
    /// The flags a server answers `client` flags with (NTLMv2 with extended session security):
    /// UNICODE, REQUEST_TARGET, NTLM, ALWAYS_SIGN, TARGET_TYPE_SERVER, EXTENDED_SESSIONSECURITY,
    /// TARGET_INFO, VERSION and 128 always; SIGN, SEAL, KEY_EXCH and 56 when the client asks.
    pub fn answer_flags(client: u32) -> u32 {
        use flags::*;
        let always = UNICODE
            | REQUEST_TARGET
            | NTLM
            | ALWAYS_SIGN
            | TARGET_TYPE_SERVER
            | EXTENDED_SESSIONSECURITY
            | TARGET_INFO
            | VERSION
            | NEG_128;
        always | (client & (SIGN | SEAL | KEY_EXCH | NEG_56))
    }

    /// Parses a CHALLENGE (MS-NLMP 2.2.1.2). The target name is read as UTF-16LE when the
    /// flags say UNICODE; a missing target info is an empty list.
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut r = header(buf, 2)?;
        let (name, _) = field(buf, &mut r)?;
        let flags = r.u32()?;
        let server_challenge = r.array()?;
        r.skip(8)?;
        let (info, info_off) = field(buf, &mut r)?;
        let version = if flags & flags::VERSION != 0 && buf.len() >= 56 {
            r.array()?
        } else {
            [0; 8]
        };
        let target_name = if flags & flags::UNICODE != 0 {
            from_utf16le(name, "NTLM target name")?
        } else {
            String::from_utf8_lossy(name).into_owned()
        };
        let target_info = if info_off == usize::MAX {
            Vec::new()
        } else {
            parse_av_pairs(info)?
        };
        Ok(ChallengeMessage {
            target_name,
            flags,
            server_challenge,
            target_info,
            version,
        })
    }

    /// The MsvAvTimestamp the server sent, if any.
    pub fn timestamp(&self) -> Option<u64> {
        self.target_info
            .iter()
            .find(|p| p.id == av::TIMESTAMP)
            .and_then(|p| p.value.as_slice().try_into().ok())
            .map(u64::from_le_bytes)
    }

    pub fn encode(&self) -> Vec<u8> {
        let name = utf16le(&self.target_name);
        let mut info = Vec::new();
        encode_av_pairs(&self.target_info, &mut info);
        let base = 56u32;
        let mut out = Vec::with_capacity(56 + name.len() + info.len());
        out.extend_from_slice(SIGNATURE);
        put_u32(&mut out, 2);
        put_u16(&mut out, name.len() as u16);
        put_u16(&mut out, name.len() as u16);
        put_u32(&mut out, base);
        put_u32(&mut out, self.flags);
        out.extend_from_slice(&self.server_challenge);
        out.extend_from_slice(&[0; 8]);
        put_u16(&mut out, info.len() as u16);
        put_u16(&mut out, info.len() as u16);
        put_u32(&mut out, base + name.len() as u32);
        out.extend_from_slice(&self.version);
        out.extend_from_slice(&name);
        out.extend_from_slice(&info);
        out
    }
}

/// A parsed AUTHENTICATE message; fields borrow the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticateMessage<'a> {
    pub lm_response: &'a [u8],
    pub nt_response: &'a [u8],
    pub domain: &'a [u8],
    pub user: &'a [u8],
    pub workstation: &'a [u8],
    pub encrypted_random_session_key: &'a [u8],
    pub flags: u32,
    /// The MIC, when the payload leaves room for it (offset 72).
    pub mic: Option<[u8; 16]>,
}

/// Where the MIC sits in an AUTHENTICATE message.
pub const MIC_OFFSET: usize = 72;

impl<'a> AuthenticateMessage<'a> {
    pub fn decode(buf: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = header(buf, 3)?;
        let (lm_response, o1) = field(buf, &mut r)?;
        let (nt_response, o2) = field(buf, &mut r)?;
        let (domain, o3) = field(buf, &mut r)?;
        let (user, o4) = field(buf, &mut r)?;
        let (workstation, o5) = field(buf, &mut r)?;
        let (encrypted_random_session_key, o6) = field(buf, &mut r)?;
        let flags = r.u32()?;
        let first = [o1, o2, o3, o4, o5, o6]
            .into_iter()
            .min()
            .unwrap_or(usize::MAX);
        if first < r.pos() {
            return Err(DecodeError::OutOfBounds("NTLM payload overlaps the header"));
        }
        let mic = if first >= MIC_OFFSET + 16 && buf.len() >= MIC_OFFSET + 16 {
            let mut m = [0u8; 16];
            m.copy_from_slice(crate::wire::slice(buf, MIC_OFFSET, 16, "MIC")?);
            Some(m)
        } else {
            None
        };
        Ok(AuthenticateMessage {
            lm_response,
            nt_response,
            domain,
            user,
            workstation,
            encrypted_random_session_key,
            flags,
            mic,
        })
    }

    /// The message as a client sends it (MS-NLMP 2.2.1.3): the fixed fields, the 8-byte
    /// VERSION, the MIC when `mic` is Some (zeros until the caller patches it in at
    /// [`MIC_OFFSET`]), then the payload in the order domain, user, workstation, LM response,
    /// NT response, encrypted session key.
    pub fn encode(&self, version: [u8; 8]) -> Vec<u8> {
        let fixed = 64 + 8 + if self.mic.is_some() { 16 } else { 0 };
        let payload = [
            self.domain,
            self.user,
            self.workstation,
            self.lm_response,
            self.nt_response,
            self.encrypted_random_session_key,
        ];
        let mut offsets = [0u32; 6];
        let mut at = fixed as u32;
        for (o, p) in offsets.iter_mut().zip(payload) {
            *o = at;
            at += p.len() as u32;
        }
        let mut out = Vec::with_capacity(at as usize);
        out.extend_from_slice(SIGNATURE);
        put_u32(&mut out, 3);
        // The fields are listed LM, NT, domain, user, workstation, key.
        for i in [3usize, 4, 0, 1, 2, 5] {
            let (p, o) = (
                payload.get(i).copied().unwrap_or(&[]),
                offsets.get(i).copied().unwrap_or(0),
            );
            put_u16(&mut out, p.len() as u16);
            put_u16(&mut out, p.len() as u16);
            put_u32(&mut out, o);
        }
        put_u32(&mut out, self.flags);
        out.extend_from_slice(&version);
        if let Some(m) = self.mic {
            out.extend_from_slice(&m);
        }
        payload.iter().for_each(|p| out.extend_from_slice(p));
        out
    }

    pub fn user_name(&self) -> Result<String, DecodeError> {
        self.text(self.user)
    }
    pub fn domain_name(&self) -> Result<String, DecodeError> {
        self.text(self.domain)
    }
    pub fn workstation_name(&self) -> Result<String, DecodeError> {
        self.text(self.workstation)
    }
    fn text(&self, b: &[u8]) -> Result<String, DecodeError> {
        if self.flags & flags::UNICODE != 0 {
            from_utf16le(b, "NTLM name")
        } else {
            String::from_utf8(b.to_vec()).map_err(|_| DecodeError::Invalid("NTLM OEM name"))
        }
    }
}

/// The parts of an NTLMv2 response (MS-NLMP 2.2.2.7, 2.2.2.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NtlmV2Response<'a> {
    pub nt_proof_str: &'a [u8],
    /// Everything after NTProofStr (the "temp" of MS-NLMP 3.3.2).
    pub blob: &'a [u8],
    pub timestamp: u64,
    pub client_challenge: [u8; 8],
    pub av_pairs: Vec<AvPair>,
}

impl<'a> NtlmV2Response<'a> {
    pub fn decode(nt: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(nt, "NTLMv2 response");
        let nt_proof_str = r.bytes(16)?;
        let blob = nt.get(16..).unwrap_or(&[]);
        if r.u8()? != 1 || r.u8()? != 1 {
            return Err(DecodeError::Invalid("NTLMv2 response version"));
        }
        r.skip(6)?;
        let timestamp = r.u64()?;
        let client_challenge = r.array()?;
        r.skip(4)?;
        let av_pairs = parse_av_pairs(nt.get(r.pos()..).unwrap_or(&[]))?;
        Ok(NtlmV2Response {
            nt_proof_str,
            blob,
            timestamp,
            client_challenge,
            av_pairs,
        })
    }

    pub fn av_flags(&self) -> u32 {
        self.av_pairs
            .iter()
            .find(|p| p.id == av::FLAGS)
            .and_then(|p| p.value.as_slice().try_into().ok())
            .map(u32::from_le_bytes)
            .unwrap_or(0)
    }
}
