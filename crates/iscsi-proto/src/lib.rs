//! Sans-IO iSCSI (RFC 7143): PDUs and their codec, text keys and negotiation, login and CHAP,
//! and the sequence-number windows. No sockets, no clocks, no threads: drivers feed bytes in and
//! take PDUs out.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod chap;
pub mod login;
pub mod negotiation;
pub mod pdu;
pub mod serial;
pub mod text;
pub mod text_exchange;
pub mod vectored;
pub mod window;

pub use pdu::{Framer, Pdu, PduError};
