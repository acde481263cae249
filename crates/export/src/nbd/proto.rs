//! NBD wire messages, one type per message, with `decode` from a buffer (checking that the
//! whole message is there before consuming anything) and `encode` into one. No I/O.
//!
//! Codes are newtypes with named constants, so values this server does not know still decode
//! and round-trip.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// `NBDMAGIC`, first word of the server greeting.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second word of the greeting and first of every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every fixed-newstyle option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC`.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_SIMPLE_REPLY_MAGIC`.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// What stops a message from decoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// Not all of the message is buffered yet; nothing was consumed.
    #[error("incomplete message: {needed} more bytes needed")]
    Incomplete { needed: usize },
    #[error("bad magic {found:#x} (expected {expected:#x})")]
    BadMagic { expected: u64, found: u64 },
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        what: &'static str,
        len: u64,
        max: u64,
    },
    #[error("malformed {0}")]
    Malformed(&'static str),
}

macro_rules! code {
    ($(#[$meta:meta])* $name:ident($repr:ty) { $($(#[$cmeta:meta])* $konst:ident = $value:expr,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $repr);
        impl $name {
            $($(#[$cmeta])* pub const $konst: $name = $name($value);)*
            /// The constant's name, if this value has one.
            pub fn name(self) -> Option<&'static str> {
                match self {
                    $($name::$konst => Some(stringify!($konst)),)*
                    _ => None,
                }
            }
        }
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self.name() {
                    Some(name) => write!(f, "{name}"),
                    None => write!(f, "{}({:#x})", stringify!($name), self.0),
                }
            }
        }
    };
}

macro_rules! flags {
    ($(#[$meta:meta])* $name:ident($repr:ty) { $($(#[$cmeta:meta])* $konst:ident = $value:expr,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
        pub struct $name(pub $repr);
        impl $name {
            $($(#[$cmeta])* pub const $konst: $name = $name($value);)*
            /// Every flag this server knows.
            pub const KNOWN: $name = $name(0 $(| $value)*);
            pub fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }
        }
        impl std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }
    };
}

flags!(
    /// Handshake flags (server, 16 bits).
    HandshakeFlags(u16) {
        FIXED_NEWSTYLE = 1 << 0,
        NO_ZEROES = 1 << 1,
    }
);

flags!(
    /// Client flags (32 bits), the client's answer to the greeting.
    ClientFlags(u32) {
        FIXED_NEWSTYLE = 1 << 0,
        NO_ZEROES = 1 << 1,
    }
);

flags!(
    /// Transmission flags (16 bits) of an export.
    TransmissionFlags(u16) {
        HAS_FLAGS = 1 << 0,
        READ_ONLY = 1 << 1,
        SEND_FLUSH = 1 << 2,
        SEND_FUA = 1 << 3,
        ROTATIONAL = 1 << 4,
        SEND_TRIM = 1 << 5,
        SEND_WRITE_ZEROES = 1 << 6,
        SEND_DF = 1 << 7,
        CAN_MULTI_CONN = 1 << 8,
        SEND_RESIZE = 1 << 9,
        SEND_CACHE = 1 << 10,
        SEND_FAST_ZERO = 1 << 11,
    }
);

flags!(
    /// Command flags (16 bits) of a request.
    CommandFlags(u16) {
        FUA = 1 << 0,
        NO_HOLE = 1 << 1,
        DF = 1 << 2,
        REQ_ONE = 1 << 3,
        FAST_ZERO = 1 << 4,
        PAYLOAD_LEN = 1 << 5,
    }
);

code!(
    /// Option types of the handshake phase.
    OptionCode(u32) {
        EXPORT_NAME = 1,
        ABORT = 2,
        LIST = 3,
        PEEK_EXPORT = 4,
        STARTTLS = 5,
        INFO = 6,
        GO = 7,
        STRUCTURED_REPLY = 8,
        LIST_META_CONTEXT = 9,
        SET_META_CONTEXT = 10,
        EXTENDED_HEADERS = 11,
    }
);

const ERR: u32 = 1 << 31;

code!(
    /// Option reply types; errors have bit 31 set.
    ReplyType(u32) {
        ACK = 1,
        SERVER = 2,
        INFO = 3,
        META_CONTEXT = 4,
        ERR_UNSUP = ERR + 1,
        ERR_POLICY = ERR + 2,
        ERR_INVALID = ERR + 3,
        ERR_PLATFORM = ERR + 4,
        ERR_TLS_REQD = ERR + 5,
        ERR_UNKNOWN = ERR + 6,
        ERR_SHUTDOWN = ERR + 7,
        ERR_BLOCK_SIZE_REQD = ERR + 8,
        ERR_TOO_BIG = ERR + 9,
        ERR_EXT_HEADER_REQD = ERR + 10,
    }
);

impl ReplyType {
    pub fn is_error(self) -> bool {
        self.0 & ERR != 0
    }
}

code!(
    /// Information types of `NBD_OPT_INFO` / `NBD_OPT_GO`.
    InfoType(u16) {
        EXPORT = 0,
        NAME = 1,
        DESCRIPTION = 2,
        BLOCK_SIZE = 3,
    }
);

code!(
    /// Request types of the transmission phase.
    Command(u16) {
        READ = 0,
        WRITE = 1,
        DISC = 2,
        FLUSH = 3,
        TRIM = 4,
        CACHE = 5,
        WRITE_ZEROES = 6,
        BLOCK_STATUS = 7,
        RESIZE = 8,
    }
);

code!(
    /// Error values of replies ("Error values": fixed numbers, not the host's errno).
    ErrorCode(u32) {
        OK = 0,
        EPERM = 1,
        EIO = 5,
        ENOMEM = 12,
        EINVAL = 22,
        ENOSPC = 28,
        EOVERFLOW = 75,
        ENOTSUP = 95,
        ESHUTDOWN = 108,
    }
);

/// Fails with `Incomplete` unless `n` bytes are buffered.
fn need(buf: &impl Buf, n: usize) -> Result<(), ProtoError> {
    match n.checked_sub(buf.remaining()) {
        Some(needed) if needed > 0 => Err(ProtoError::Incomplete { needed }),
        _ => Ok(()),
    }
}

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

/// C: a transmission request header ("Request message"); a write's payload follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: CommandFlags,
    pub command: Command,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    pub const LEN: usize = 28;

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u32(REQUEST_MAGIC);
        buf.put_u16(self.flags.0);
        buf.put_u16(self.command.0);
        buf.put_u64(self.cookie);
        buf.put_u64(self.offset);
        buf.put_u32(self.length);
    }

    pub fn decode(buf: &mut impl Buf) -> Result<Request, ProtoError> {
        need(buf, Self::LEN)?;
        let magic = buf.get_u32();
        if magic != REQUEST_MAGIC {
            return Err(ProtoError::BadMagic {
                expected: u64::from(REQUEST_MAGIC),
                found: u64::from(magic),
            });
        }
        Ok(Request {
            flags: CommandFlags(buf.get_u16()),
            command: Command(buf.get_u16()),
            cookie: buf.get_u64(),
            offset: buf.get_u64(),
            length: buf.get_u32(),
        })
    }

    /// Payload bytes that follow this header on the wire (only writes carry one).
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::WRITE {
            self.length
        } else {
            0
        }
    }
}

/// S: a simple reply header ("Simple reply message"); a successful read's data follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    pub error: ErrorCode,
    pub cookie: u64,
}

impl SimpleReply {
    pub const LEN: usize = 16;

    /// The header as bytes, for a vectored write with the data beside it.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        self.encode(&mut &mut out[..]);
        out
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u32(SIMPLE_REPLY_MAGIC);
        buf.put_u32(self.error.0);
        buf.put_u64(self.cookie);
    }

    pub fn decode(buf: &mut impl Buf) -> Result<SimpleReply, ProtoError> {
        need(buf, Self::LEN)?;
        let magic = buf.get_u32();
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(ProtoError::BadMagic {
                expected: u64::from(SIMPLE_REPLY_MAGIC),
                found: u64::from(magic),
            });
        }
        Ok(SimpleReply {
            error: ErrorCode(buf.get_u32()),
            cookie: buf.get_u64(),
        })
    }
}
