//! Sans-IO SMB 3.1.1 for the lanes server: the SMB2 header and compound chains, the direct-TCP
//! framing, one type per wire message, the credit window, the preauth integrity hash, the
//! SP800-108 key schedule, signing (AES-CMAC, AES-GMAC), the transform header (AES-CCM, AES-GCM),
//! and server-side NTLMv2 inside SPNEGO.
//!
//! Nothing here opens a socket, reads a clock or draws random bytes: time, challenges, salts and
//! nonces are arguments. Decoders never panic on peer input; their errors say which status the
//! server answers with (or that it drops the connection).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod auth;
pub mod compound;
pub mod credits;
pub mod crypto;
pub mod error;
pub mod framing;
pub mod header;
pub mod msg;
pub mod server;
pub mod smb1;
pub mod status;
pub(crate) mod wire;

pub use compound::{split_compound, split_compound_partial, Element, RelatedIds, ResponseChain};
pub use error::{Answer, DecodeError};
pub use framing::DirectTcp;
pub use header::{Command, Flags, Header, HeaderIds, HEADER_LEN};
pub use status::NtStatus;
