//! lanes' active-active replication core (sans-IO). See `docs/REPLICATION.md`.

pub mod codec;
pub mod meta;
pub mod wire;

pub use codec::{decode, encode, encode_split, encode_to_vec, DecodeError};
pub use meta::{Generations, Meta, MetaOp};
pub use wire::*;
pub mod action;
mod al;
pub mod config;
pub mod epoch;
mod intervals;
pub mod node;

pub use action::{
    AbortScope, Action, Alua, CawOutcome, Event, HostError, SharedOutcome, Token, WriteId,
};
pub use config::{Config, ConfigError, Nanos};
pub use epoch::{EpochRecord, RaceOutcome};
pub use node::{Replica, State, Stats};
