//! lanes' multipath core (sans-IO): path states, health scoring, path selectors and request
//! splitting. No sockets, no clocks, no threads: time comes in as an argument.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod health;
pub mod path;
pub mod pathset;
pub mod policy;
pub mod select;
pub mod split;
pub mod state;

pub use health::{Event, HealthConfig, PathSample};
pub use path::{tier_name, PathId, PathView, TIER_NON_OPTIMIZED, TIER_NO_IO, TIER_OPTIMIZED};
pub use pathset::PathSet;
pub use policy::{Failback, ParseError, Policy};
pub use select::Selector;
pub use split::{split, Pieces};
pub use state::PathState;
