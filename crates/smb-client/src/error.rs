//! What can go wrong talking to an SMB server: the network, the server's answer, or a server
//! that does not follow the protocol.

use std::net::SocketAddr;

use smb_proto::client::ClientError;
use smb_proto::{Command, DecodeError, NtStatus};

#[derive(Debug, thiserror::Error)]
pub enum SmbError {
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("connect to {0}: timed out")]
    ConnectTimeout(SocketAddr),
    #[error("network: {0}")]
    Io(#[from] std::io::Error),
    #[error("{command:?} failed with status {:#010x}{}", status.0, status_name(*status))]
    Status { command: Command, status: NtStatus },
    #[error("server did not follow the protocol: {0}")]
    Protocol(String),
    #[error("malformed message from the server: {0}")]
    Decode(#[from] DecodeError),
    #[error("response signature does not verify")]
    BadSignature,
    #[error("channel to {peer} closed: {reason}")]
    Closed { peer: SocketAddr, reason: String },
    #[error("{0}")]
    Usage(String),
    #[error("verify: {0}")]
    Verify(String),
}

impl SmbError {
    pub fn status(&self) -> Option<NtStatus> {
        match self {
            SmbError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
    pub(crate) fn from_client(command: Command, e: ClientError) -> SmbError {
        match e {
            ClientError::Status(status) => SmbError::Status { command, status },
            ClientError::Decode(d) => SmbError::Decode(d),
            ClientError::BadSignature => SmbError::BadSignature,
            ClientError::Auth(a) => SmbError::Protocol(format!("authentication: {a}")),
            ClientError::Protocol(p) => SmbError::Protocol(p.to_string()),
        }
    }
}

fn status_name(s: NtStatus) -> &'static str {
    match s {
        NtStatus::LOGON_FAILURE => " (STATUS_LOGON_FAILURE)",
        NtStatus::ACCESS_DENIED => " (STATUS_ACCESS_DENIED)",
        NtStatus::BAD_NETWORK_NAME => " (STATUS_BAD_NETWORK_NAME)",
        NtStatus::OBJECT_NAME_NOT_FOUND => " (STATUS_OBJECT_NAME_NOT_FOUND)",
        NtStatus::USER_SESSION_DELETED => " (STATUS_USER_SESSION_DELETED)",
        NtStatus::NOT_SUPPORTED => " (STATUS_NOT_SUPPORTED)",
        NtStatus::INVALID_PARAMETER => " (STATUS_INVALID_PARAMETER)",
        NtStatus::REQUEST_NOT_ACCEPTED => " (STATUS_REQUEST_NOT_ACCEPTED)",
        _ => "",
    }
}
