//! The client side of SMB 3.1.1, sans-IO like the rest of the crate: what a NEGOTIATE offers
//! and what its response settles, SPNEGO around NTLMv2, the SESSION_SETUP exchange for a new
//! session or a channel binding (with its preauth hash and keys), and per-channel message ids
//! and credits. A driver moves the bytes; nothing here reads a clock or draws random bytes.

pub mod auth;
pub mod connection;
pub mod credits;
pub mod negotiate;
pub mod setup;

pub use auth::ClientAuth;
pub use connection::{check_response_signature, ClientConnection};
pub use credits::ClientCredits;
pub use negotiate::{negotiate_request, settle, ClientNegotiateConfig, ClientNegotiated};
pub use setup::{Binding, SessionSetup, SetupDone, SetupStep};

use crate::auth::AuthError;
use crate::error::DecodeError;
use crate::status::NtStatus;

/// Why a client-side step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("malformed message from the server: {0}")]
    Decode(#[from] DecodeError),
    #[error("authentication: {0}")]
    Auth(#[from] AuthError),
    #[error("server answered {0:?}")]
    Status(NtStatus),
    #[error("server did not follow the protocol: {0}")]
    Protocol(&'static str),
    #[error("response signature does not verify")]
    BadSignature,
}

/// A request header with the fields a client sets; the rest are zero.
pub fn request_header(
    command: crate::Command,
    message_id: u64,
    credit_charge: u16,
    credit_request: u16,
    session_id: u64,
    tree_id: u32,
) -> crate::Header {
    crate::Header {
        credit_charge,
        status: 0,
        command,
        credits: credit_request,
        flags: crate::Flags(0),
        next_command: 0,
        message_id,
        ids: crate::HeaderIds::Sync {
            process_id: 0xFEFF,
            tree_id,
        },
        session_id,
        signature: [0; 16],
    }
}
