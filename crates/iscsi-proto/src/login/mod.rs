//! Target-side login (RFC 7143 6.3 and 11.12/11.13): the sans-IO state machine a connection runs
//! before the full-feature phase, the policy hooks it calls, and its outcome.
//!
//! ```text
//!   RFC 7143 8.2 (target connection states, login part), as this machine implements it:
//!
//!        first Login Request
//!   Initial ───────────────┬──────────────────────────────┐
//!                CSG=0     │                              │ CSG=1 (only when the policy
//!                          v                              v  demands no authentication)
//!               SecurityNegotiation ──T=1,NSG=1──> OperationalNegotiation
//!               { AwaitAuthMethod                         │
//!                 -> AwaitAlgorithm (CHAP_A)              │ T=1,NSG=3
//!                 -> AwaitResponse (CHAP_N/R)             v
//!                 -> Authenticated }  ──T=1,NSG=3──>    Done  (final response: TSIH, status 0)
//!                          │
//!                          └─ any error ──> Failed (login reject sent, connection closed)
//! ```
//!
//! A request with C=1 only adds text; the machine answers it with an empty response and
//! processes the keys once the last piece (C=0) is in.

mod machine;
mod security;

pub use crate::chap::ChapCredentials;
pub use machine::TargetLogin;

use crate::negotiation::{ConnectionParams, SessionParams};
use crate::pdu::LoginResponse;

/// Decisions the login needs from the target (ACLs, sessions, randomness).
pub trait LoginPolicy {
    /// TPGT of the portal this connection arrived on.
    fn portal_group_tag(&self) -> u16;
    /// Normal session: may `initiator` log into `target`? Returns the CHAP secrets to demand
    /// (None = AuthMethod None allowed) or a refusal.
    fn authorize(
        &mut self,
        initiator_name: &str,
        target_name: &str,
    ) -> Result<Option<ChapCredentials>, LoginRefusal>;
    /// Discovery session: CHAP demanded, if any.
    fn discovery_auth(
        &mut self,
        initiator_name: &str,
    ) -> Result<Option<ChapCredentials>, LoginRefusal>;
    /// Called once negotiation is complete, just before the final (T=1, NSG=3) response:
    /// create or join the session. Leading login (tsih == 0): new session, possibly reinstating
    /// one with the same initiator name + ISID; returns the TSIH to put in the response.
    /// Non-leading (tsih != 0, adds connection `cid` to a session, MC/S): Ok(tsih) or
    /// Err(SessionDoesNotExist / TooManyConnections / ...).
    fn admit(&mut self, login: &LoginOutcome) -> Result<u16, LoginRefusal>;
    /// Fresh random bytes for CHAP identifiers and challenges.
    fn fill_random(&mut self, buf: &mut [u8]);
}

/// Why a login is refused; each maps to a Login Response status (RFC 7143 11.13.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoginRefusal {
    AuthenticationFailed,
    AuthorizationFailure,
    NotFound,
    TargetRemoved,
    UnsupportedVersion,
    TooManyConnections,
    MissingParameter,
    CannotIncludeInSession,
    SessionTypeNotSupported,
    SessionDoesNotExist,
    InvalidDuringLogin,
    InitiatorError,
    TargetError,
    ServiceUnavailable,
    OutOfResources,
}

impl LoginRefusal {
    /// (Status-Class, Status-Detail) per RFC 7143 11.13.5.
    pub fn status(&self) -> (u8, u8) {
        match self {
            LoginRefusal::InitiatorError => (0x02, 0x00),
            LoginRefusal::AuthenticationFailed => (0x02, 0x01),
            LoginRefusal::AuthorizationFailure => (0x02, 0x02),
            LoginRefusal::NotFound => (0x02, 0x03),
            LoginRefusal::TargetRemoved => (0x02, 0x04),
            LoginRefusal::UnsupportedVersion => (0x02, 0x05),
            LoginRefusal::TooManyConnections => (0x02, 0x06),
            LoginRefusal::MissingParameter => (0x02, 0x07),
            LoginRefusal::CannotIncludeInSession => (0x02, 0x08),
            LoginRefusal::SessionTypeNotSupported => (0x02, 0x09),
            LoginRefusal::SessionDoesNotExist => (0x02, 0x0a),
            LoginRefusal::InvalidDuringLogin => (0x02, 0x0b),
            LoginRefusal::TargetError => (0x03, 0x00),
            LoginRefusal::ServiceUnavailable => (0x03, 0x01),
            LoginRefusal::OutOfResources => (0x03, 0x02),
        }
    }
}

impl std::fmt::Display for LoginRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (class, detail) = self.status();
        let what = match self {
            LoginRefusal::InitiatorError => "initiator error",
            LoginRefusal::AuthenticationFailed => "authentication failed",
            LoginRefusal::AuthorizationFailure => "authorization failure",
            LoginRefusal::NotFound => "target not found",
            LoginRefusal::TargetRemoved => "target removed",
            LoginRefusal::UnsupportedVersion => "unsupported version",
            LoginRefusal::TooManyConnections => "too many connections",
            LoginRefusal::MissingParameter => "missing parameter",
            LoginRefusal::CannotIncludeInSession => "cannot include in session",
            LoginRefusal::SessionTypeNotSupported => "session type not supported",
            LoginRefusal::SessionDoesNotExist => "session does not exist",
            LoginRefusal::InvalidDuringLogin => "invalid request during login",
            LoginRefusal::TargetError => "target error",
            LoginRefusal::ServiceUnavailable => "service unavailable",
            LoginRefusal::OutOfResources => "out of resources",
        };
        write!(f, "{what} (status {class:#04x}/{detail:#04x})")
    }
}

/// Everything the driver needs to enter the full-feature phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginOutcome {
    pub isid: [u8; 6],
    /// The TSIH the initiator requested (0 = new session).
    pub tsih: u16,
    pub cid: u16,
    /// On a non-leading connection (tsih != 0) only the identity fields are meaningful: the
    /// session-wide values were settled by the leading login and leading-only keys were
    /// answered Irrelevant here.
    pub session: SessionParams,
    pub connection: ConnectionParams,
    /// CHAP_N of an initiator that authenticated with CHAP.
    pub authenticated_user: Option<String>,
    /// StatSN the connection's next response (after the final Login Response) carries.
    pub next_stat_sn: u32,
    /// ExpCmdSN after login (the Login Request's CmdSN; login requests are immediate).
    pub exp_cmd_sn: u32,
}

/// What to do after feeding a Login Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginStep {
    /// Send the response and wait for the next Login Request.
    Continue(LoginResponse),
    /// Send, then switch to the full-feature phase with the outcome's parameters.
    Complete(LoginResponse, Box<LoginOutcome>),
    /// Send, log once with initiator/portal/reason, then close the connection.
    Failed(LoginResponse, LoginRefusal),
}

impl LoginStep {
    pub fn response(&self) -> &LoginResponse {
        match self {
            LoginStep::Continue(r) | LoginStep::Complete(r, _) | LoginStep::Failed(r, _) => r,
        }
    }
}
