//! Sans-IO SMB 3.1.1 for the lanes server: the SMB2 header and compound chains, the direct-TCP
//! framing, one type per wire message, the credit window, the preauth integrity hash, the
//! SP800-108 key schedule, signing (AES-CMAC, AES-GMAC), the transform header (AES-CCM, AES-GCM),
//! and server-side NTLMv2 inside SPNEGO.
//!
//! Nothing here opens a socket, reads a clock or draws random bytes: time, challenges, salts and
//! nonces are arguments. Decoders never panic on peer input; their errors say which status the
//! server answers with (or that it drops the connection).
//!
//! A request's way through, with an ECHO:
//!
//! ```
//! use smb_proto::crypto::{SigningAlgorithm, SigningKey};
//! use smb_proto::msg::{encode_message, EchoRequest, EchoResponse, Request};
//! use smb_proto::{split_compound, Command, DirectTcp, Header, NtStatus};
//!
//! // What a client might send: one ECHO, framed for direct TCP.
//! let mut blank = vec![0xFE, b'S', b'M', b'B', 64, 0];
//! blank.resize(64, 0);
//! let mut h = Header::decode(&blank).unwrap();
//! h.command = Command::Echo;
//! h.message_id = 7;
//! let msg = encode_message(&h, &EchoRequest);
//! let mut wire = DirectTcp::prefix(msg.len()).unwrap().to_vec();
//! wire.extend_from_slice(&msg);
//!
//! // The server: frame, chain, request.
//! let (used, frame) = DirectTcp::default().decode(&wire).unwrap().unwrap();
//! assert_eq!(used, wire.len());
//! for e in split_compound(frame).unwrap() {
//!     let req = Request::decode(&e.header, e.bytes).unwrap();
//!     assert_eq!(req, Request::Echo(EchoRequest));
//!     // The answer, signed with the session's key.
//!     let resp = Header::response_to(&e.header, NtStatus::SUCCESS, 1);
//!     let mut out = encode_message(&resp, &EchoResponse);
//!     let key = SigningKey::new(SigningAlgorithm::AesGmac, [0x11; 16]);
//!     key.sign(&mut out).unwrap();
//!     assert!(key.verify(&out));
//! }
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod auth;
pub mod client;
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
pub use framing::{DirectTcp, FrameKind};
pub use header::{Command, Flags, Header, HeaderIds, HEADER_LEN};
pub use status::NtStatus;
pub use wire::{from_utf16le, utf16le};
