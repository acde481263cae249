//! Decode errors, each mapped to the answer MS-SMB2 3.3.5 prescribes for it.

use crate::status::NtStatus;

/// What the server does about a malformed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Send an error response with this status.
    Status(NtStatus),
    /// Drop the transport connection without answering.
    Disconnect,
}

/// Why bytes from the peer did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{what}: need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("protocol id is not 0xFE 'SMB'")]
    BadProtocolId,
    #[error("header StructureSize {0}, expected 64")]
    HeaderSize(u16),
    #[error("{what}: StructureSize {found}, expected {expected}")]
    StructureSize {
        what: &'static str,
        expected: u16,
        found: u16,
    },
    #[error("{0}: offset/length outside the message")]
    OutOfBounds(&'static str),
    #[error("{0}")]
    Invalid(&'static str),
    #[error("compound element {index}: {reason}")]
    Compound { index: usize, reason: &'static str },
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge { len: usize, max: usize },
    #[error("direct-TCP frame type byte {0:#x} is not zero")]
    FrameType(u8),
}

impl DecodeError {
    /// The answer MS-SMB2 3.3.5 gives for this error: malformed framing, a header that is not
    /// SMB2, or a chain that cannot be walked ends the connection; a malformed body is answered
    /// with STATUS_INVALID_PARAMETER.
    pub fn answer(&self) -> Answer {
        match self {
            DecodeError::BadProtocolId
            | DecodeError::HeaderSize(_)
            | DecodeError::FrameTooLarge { .. }
            | DecodeError::FrameType(_) => Answer::Disconnect,
            DecodeError::Truncated { what, .. } if *what == "header" => Answer::Disconnect,
            _ => Answer::Status(NtStatus::INVALID_PARAMETER),
        }
    }
}
