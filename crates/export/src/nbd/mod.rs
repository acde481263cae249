//! The NBD server: sans-IO protocol ([`proto`] messages, [`handshake`] option haggling,
//! [`transmission`] request checking) and the tokio driver ([`server`], `connection`).
//!
//! Protocol reference: the NBD protocol document (proto.md) of the NetworkBlockDevice project;
//! section names quoted in comments refer to it.

pub(crate) mod connection;
pub mod handshake;
pub mod proto;
pub mod server;
pub mod transmission;
