//! The four-byte messages (LOGOFF, TREE_DISCONNECT, ECHO, CANCEL) and the ERROR response.

use super::{body, Message};
use crate::error::DecodeError;
use crate::wire::{put_u16, put_u32};

macro_rules! empty_message {
    ($(#[$m:meta])* $name:ident, $what:literal) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct $name;

        impl<'a> Message<'a> for $name {
            const STRUCTURE_SIZE: u16 = 4;
            const NAME: &'static str = $what;
            fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
                let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
                r.u16()?;
                Ok($name)
            }
            fn encode(&self, out: &mut Vec<u8>) {
                put_u16(out, Self::STRUCTURE_SIZE);
                put_u16(out, 0);
            }
        }
    };
}

empty_message!(/// MS-SMB2 2.2.7
    LogoffRequest, "LOGOFF request");
empty_message!(/// MS-SMB2 2.2.8
    LogoffResponse, "LOGOFF response");
empty_message!(/// MS-SMB2 2.2.11
    TreeDisconnectRequest, "TREE_DISCONNECT request");
empty_message!(/// MS-SMB2 2.2.12
    TreeDisconnectResponse, "TREE_DISCONNECT response");
empty_message!(/// MS-SMB2 2.2.28
    EchoRequest, "ECHO request");
empty_message!(/// MS-SMB2 2.2.29
    EchoResponse, "ECHO response");
empty_message!(/// MS-SMB2 2.2.30; it names its target by the header's MessageId or AsyncId.
    CancelRequest, "CANCEL request");

/// SMB2 ERROR response (MS-SMB2 2.2.2). `error_data` holds the error contexts or the
/// command-specific data; when empty, one zero byte is sent as the spec asks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorResponse<'a> {
    pub error_context_count: u8,
    pub error_data: &'a [u8],
}

impl<'a> Message<'a> for ErrorResponse<'a> {
    const STRUCTURE_SIZE: u16 = 9;
    const NAME: &'static str = "ERROR response";
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = body(msg, Self::STRUCTURE_SIZE, Self::NAME)?;
        let error_context_count = r.u8()?;
        r.u8()?;
        let count = r.u32()? as usize;
        let error_data = r.bytes(count)?;
        Ok(ErrorResponse {
            error_context_count,
            error_data,
        })
    }
    fn encode(&self, out: &mut Vec<u8>) {
        put_u16(out, Self::STRUCTURE_SIZE);
        out.push(self.error_context_count);
        out.push(0);
        put_u32(out, self.error_data.len() as u32);
        if self.error_data.is_empty() {
            out.push(0);
        } else {
            out.extend_from_slice(self.error_data);
        }
    }
}
