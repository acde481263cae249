//! Handshake-phase messages: greeting, client flags, option requests and replies, and the
//! data of `NBD_OPT_INFO`/`NBD_OPT_GO` and their `NBD_REP_INFO` replies.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{
    need, ClientFlags, HandshakeFlags, InfoType, OptionCode, ProtoError, ReplyType,
    TransmissionFlags, IHAVEOPT, NBD_MAGIC, OPTION_REPLY_MAGIC,
};

/// S: `NBDMAGIC`, `IHAVEOPT`, handshake flags ("Newstyle negotiation").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Greeting {
    pub flags: HandshakeFlags,
}

impl Greeting {
    pub const LEN: usize = 18;

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u64(NBD_MAGIC);
        buf.put_u64(IHAVEOPT);
        buf.put_u16(self.flags.0);
    }

    pub fn decode(buf: &mut impl Buf) -> Result<Greeting, ProtoError> {
        need(buf, Self::LEN)?;
        let magic = buf.get_u64();
        let opt = buf.get_u64();
        let flags = HandshakeFlags(buf.get_u16());
        if magic != NBD_MAGIC {
            return Err(ProtoError::BadMagic {
                expected: NBD_MAGIC,
                found: magic,
            });
        }
        if opt != IHAVEOPT {
            return Err(ProtoError::BadMagic {
                expected: IHAVEOPT,
                found: opt,
            });
        }
        Ok(Greeting { flags })
    }
}

impl ClientFlags {
    pub const LEN: usize = 4;

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u32(self.0);
    }

    pub fn decode(buf: &mut impl Buf) -> Result<ClientFlags, ProtoError> {
        need(buf, Self::LEN)?;
        Ok(ClientFlags(buf.get_u32()))
    }
}

/// C: `IHAVEOPT`, option, length: the fixed part of an option request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: OptionCode,
    pub length: u32,
}

impl OptionHeader {
    pub const LEN: usize = 16;

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u64(IHAVEOPT);
        buf.put_u32(self.option.0);
        buf.put_u32(self.length);
    }

    pub fn decode(buf: &mut impl Buf) -> Result<OptionHeader, ProtoError> {
        need(buf, Self::LEN)?;
        let found = buf.get_u64();
        if found != IHAVEOPT {
            return Err(ProtoError::BadMagic {
                expected: IHAVEOPT,
                found,
            });
        }
        let option = OptionCode(buf.get_u32());
        let length = buf.get_u32();
        Ok(OptionHeader { option, length })
    }
}

/// A whole option request: header and data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionRequest {
    pub option: OptionCode,
    pub data: Bytes,
}

impl OptionRequest {
    pub fn encode(&self, buf: &mut impl BufMut) {
        OptionHeader {
            option: self.option,
            length: self.data.len() as u32,
        }
        .encode(buf);
        buf.put_slice(&self.data);
    }

    /// Decodes a request whose data is at most `max_data` bytes; a longer one is `TooLarge`,
    /// and then nothing is consumed, so the caller can answer it and skip its data.
    pub fn decode(buf: &mut BytesMut, max_data: u32) -> Result<OptionRequest, ProtoError> {
        let mut peek: &[u8] = buf.as_ref();
        let header = OptionHeader::decode(&mut peek)?;
        if header.length > max_data {
            return Err(ProtoError::TooLarge {
                what: "option data",
                len: u64::from(header.length),
                max: u64::from(max_data),
            });
        }
        need(buf, OptionHeader::LEN + header.length as usize)?;
        buf.advance(OptionHeader::LEN);
        let data = buf.split_to(header.length as usize).freeze();
        Ok(OptionRequest {
            option: header.option,
            data,
        })
    }
}

/// S: a fixed-newstyle option reply (magic, option, reply type, length, data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionReply {
    pub option: OptionCode,
    pub reply: ReplyType,
    pub data: Bytes,
}

impl OptionReply {
    pub const HEADER_LEN: usize = 20;

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u64(OPTION_REPLY_MAGIC);
        buf.put_u32(self.option.0);
        buf.put_u32(self.reply.0);
        buf.put_u32(self.data.len() as u32);
        buf.put_slice(&self.data);
    }

    /// Decodes a reply with at most `max_data` bytes of data (client side, and tests).
    pub fn decode(buf: &mut BytesMut, max_data: u32) -> Result<OptionReply, ProtoError> {
        need(&*buf, Self::HEADER_LEN)?;
        let mut peek: &[u8] = buf.as_ref();
        let magic = peek.get_u64();
        if magic != OPTION_REPLY_MAGIC {
            return Err(ProtoError::BadMagic {
                expected: OPTION_REPLY_MAGIC,
                found: magic,
            });
        }
        let option = OptionCode(peek.get_u32());
        let reply = ReplyType(peek.get_u32());
        let length = peek.get_u32();
        if length > max_data {
            return Err(ProtoError::TooLarge {
                what: "option reply data",
                len: u64::from(length),
                max: u64::from(max_data),
            });
        }
        need(&*buf, Self::HEADER_LEN + length as usize)?;
        buf.advance(Self::HEADER_LEN);
        let data = buf.split_to(length as usize).freeze();
        Ok(OptionReply {
            option,
            reply,
            data,
        })
    }
}

/// S: the answer to `NBD_OPT_EXPORT_NAME`: size, transmission flags, and 124 zero bytes unless
/// the client set `NBD_FLAG_C_NO_ZEROES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportNameReply {
    pub size: u64,
    pub flags: TransmissionFlags,
    pub zero_padding: bool,
}

impl ExportNameReply {
    pub const PADDING: usize = 124;

    pub fn len(&self) -> usize {
        10 + if self.zero_padding { Self::PADDING } else { 0 }
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u64(self.size);
        buf.put_u16(self.flags.0);
        if self.zero_padding {
            buf.put_bytes(0, Self::PADDING);
        }
    }

    pub fn decode(buf: &mut impl Buf, zero_padding: bool) -> Result<ExportNameReply, ProtoError> {
        let reply_len = 10 + if zero_padding { Self::PADDING } else { 0 };
        need(buf, reply_len)?;
        let size = buf.get_u64();
        let flags = TransmissionFlags(buf.get_u16());
        if zero_padding {
            buf.advance(Self::PADDING);
        }
        Ok(ExportNameReply {
            size,
            flags,
            zero_padding,
        })
    }
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`: export name and information requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: Bytes,
    pub requests: Vec<InfoType>,
}

impl InfoRequest {
    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u32(self.name.len() as u32);
        buf.put_slice(&self.name);
        buf.put_u16(self.requests.len() as u16);
        for request in &self.requests {
            buf.put_u16(request.0);
        }
    }

    /// Decodes the whole option data; lengths must add up exactly ("length of name ... MUST
    /// be no larger than the option data length - 6").
    pub fn decode(mut data: Bytes) -> Result<InfoRequest, ProtoError> {
        if data.len() < 6 {
            return Err(ProtoError::Malformed("info request shorter than 6 bytes"));
        }
        let name_len = data.get_u32() as usize;
        if name_len > data.len() - 2 {
            return Err(ProtoError::Malformed(
                "info request name longer than its data",
            ));
        }
        let name = data.split_to(name_len);
        let count = data.get_u16() as usize;
        if data.len() != count * 2 {
            return Err(ProtoError::Malformed(
                "info request count does not match its data",
            ));
        }
        let requests = (0..count).map(|_| InfoType(data.get_u16())).collect();
        Ok(InfoRequest { name, requests })
    }
}

/// The payload of an `NBD_REP_INFO` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    Export {
        size: u64,
        flags: TransmissionFlags,
    },
    Name(Bytes),
    Description(Bytes),
    BlockSize {
        minimum: u32,
        preferred: u32,
        maximum: u32,
    },
    Unknown {
        info: InfoType,
        data: Bytes,
    },
}

impl Info {
    pub fn encode(&self, buf: &mut impl BufMut) {
        match self {
            Info::Export { size, flags } => {
                buf.put_u16(InfoType::EXPORT.0);
                buf.put_u64(*size);
                buf.put_u16(flags.0);
            }
            Info::Name(name) => {
                buf.put_u16(InfoType::NAME.0);
                buf.put_slice(name);
            }
            Info::Description(text) => {
                buf.put_u16(InfoType::DESCRIPTION.0);
                buf.put_slice(text);
            }
            Info::BlockSize {
                minimum,
                preferred,
                maximum,
            } => {
                buf.put_u16(InfoType::BLOCK_SIZE.0);
                buf.put_u32(*minimum);
                buf.put_u32(*preferred);
                buf.put_u32(*maximum);
            }
            Info::Unknown { info, data } => {
                buf.put_u16(info.0);
                buf.put_slice(data);
            }
        }
    }

    /// Decodes the data of an `NBD_REP_INFO` reply (exact lengths per information type).
    pub fn decode(mut data: Bytes) -> Result<Info, ProtoError> {
        if data.len() < 2 {
            return Err(ProtoError::Malformed("info reply shorter than 2 bytes"));
        }
        let info = InfoType(data.get_u16());
        match info {
            InfoType::EXPORT if data.len() == 10 => Ok(Info::Export {
                size: data.get_u64(),
                flags: TransmissionFlags(data.get_u16()),
            }),
            InfoType::BLOCK_SIZE if data.len() == 12 => Ok(Info::BlockSize {
                minimum: data.get_u32(),
                preferred: data.get_u32(),
                maximum: data.get_u32(),
            }),
            InfoType::EXPORT | InfoType::BLOCK_SIZE => {
                Err(ProtoError::Malformed("info reply of the wrong length"))
            }
            InfoType::NAME => Ok(Info::Name(data)),
            InfoType::DESCRIPTION => Ok(Info::Description(data)),
            info => Ok(Info::Unknown { info, data }),
        }
    }
}
