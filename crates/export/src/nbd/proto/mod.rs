//! NBD wire messages, one type per message, with `decode` from a buffer (checking that the
//! whole message is there before consuming anything) and `encode` into one. No I/O.
//! Handshake-phase messages live in the `option` submodule, transmission-phase ones in `request`; this
//! module holds the magic numbers, the codes and the error type.
//!
//! Codes are newtypes with named constants, so values this server does not know still decode
//! and round-trip.

mod option;
mod request;

use bytes::Buf;

pub use option::{
    ExportNameReply, Greeting, Info, InfoRequest, OptionHeader, OptionReply, OptionRequest,
};
pub use request::{Request, SimpleReply};

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
pub(crate) fn need(buf: &impl Buf, n: usize) -> Result<(), ProtoError> {
    match n.checked_sub(buf.remaining()) {
        Some(needed) if needed > 0 => Err(ProtoError::Incomplete { needed }),
        _ => Ok(()),
    }
}
