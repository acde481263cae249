//! Authentication: client- and server-side NTLMv2 (MS-NLMP) and the SPNEGO (RFC 4178, MS-SPNG) tokens that
//! carry it in SESSION_SETUP.

pub mod der;
pub mod ntlm;
pub mod ntlm_client;
pub mod ntlm_server;
pub(crate) mod rc4;
pub mod spnego;

/// Why an authentication step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("malformed token: {0}")]
    Malformed(#[from] crate::error::DecodeError),
    #[error("unexpected NTLM message type {0}")]
    UnexpectedMessage(u32),
    #[error("NTLMv2 response does not verify")]
    BadResponse,
    #[error("unknown user")]
    UnknownUser,
    #[error("message integrity code does not verify")]
    BadMic,
    #[error("anonymous authentication is not accepted")]
    Anonymous,
    #[error("NTLMv1 or LM authentication is not accepted")]
    NotNtlmV2,
    #[error("the exchange is not in a state for this message")]
    OutOfOrder,
}
