//! Errors of the initiator: what the target did (login status, bad PDUs, SCSI status), local
//! I/O failures and timeouts, and misuse of the API, kept apart.

use std::net::SocketAddr;

/// Everything a session operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// TCP connect did not finish in time.
    #[error("cannot reach {addr}: no answer within {secs} s")]
    ConnectTimeout { addr: SocketAddr, secs: u64 },
    /// Socket-level failure.
    #[error("connection to {addr} failed")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The target refused the login with a non-zero status (RFC 7143 11.13.5).
    #[error("login refused by target: {}", login_status_text(*class, *detail))]
    LoginRefused { class: u8, detail: u8 },
    /// The target broke the protocol (bad PDU, unexpected answer, bad keys).
    #[error("protocol error from target: {0}")]
    Protocol(String),
    /// The connection ended while requests were outstanding.
    #[error("connection to the target was lost")]
    ConnectionLost,
    /// No answer in time.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// A SCSI command ended with a status other than GOOD.
    #[error("SCSI {command} failed: status {status:#04x}{}", sense_text(sense))]
    Scsi {
        command: &'static str,
        status: u8,
        sense: Option<(u8, u8, u8)>,
    },
    /// Every path stayed down for the no-path timeout.
    #[error("no path to the LUN for {secs} s")]
    NoPath { secs: u64 },
    /// No portal accepted a login when attaching.
    #[error("no path could log in: {0}")]
    NoPathAtAttach(String),
    /// A caller asked for something impossible (zero-length write, unaligned buffer, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

fn sense_text(sense: &Option<(u8, u8, u8)>) -> String {
    match sense {
        Some((k, asc, ascq)) => format!(", sense key {k:#x} ASC/ASCQ {asc:#04x}/{ascq:#04x}"),
        None => String::new(),
    }
}

/// Human text for a Login Response status (RFC 7143 11.13.5).
pub fn login_status_text(class: u8, detail: u8) -> String {
    let what = match (class, detail) {
        (1, _) => "target moved (redirection)",
        (2, 0x01) => "authentication failed",
        (2, 0x02) => "initiator not authorized for this target",
        (2, 0x03) => "target not found",
        (2, 0x04) => "target removed",
        (2, 0x05) => "unsupported version",
        (2, 0x06) => "too many connections",
        (2, 0x07) => "missing parameter",
        (2, 0x08) => "cannot include connection in session",
        (2, 0x09) => "session type not supported",
        (2, 0x0a) => "session does not exist",
        (2, 0x0b) => "invalid request during login",
        (2, _) => "initiator error",
        (3, _) => "target error",
        _ => "unknown status",
    };
    format!("{what} (status class {class:#04x}, detail {detail:#04x})")
}

/// An error with its causes, `: `-separated, for one-line messages.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}
