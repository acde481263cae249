//! Server-side steps built on the messages: choosing what a NEGOTIATE settles, and the
//! SESSION_SETUP authentication exchange. Both are plain state and functions, no I/O.

pub mod auth;
pub mod binding;
pub mod dialect;
pub mod negotiate;

pub use auth::{AuthStep, SessionAuth};
pub use dialect::Smb1Answer;
pub use negotiate::{
    negotiate, negotiate_smb1_202, wildcard_response, NegotiateConfig, Negotiated,
};
