//! lanes' active-active replication core (sans-IO). See `docs/REPLICATION.md`.

pub mod codec;
pub mod meta;
pub mod wire;

pub use codec::{decode, encode, encode_to_vec, DecodeError};
pub use meta::{Generations, Meta, MetaOp};
pub use wire::*;
