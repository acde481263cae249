//! lanes' multipath core (sans-IO): path states, health scoring, path selectors and request
//! splitting. No sockets, no clocks, no threads: time comes in as an argument.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]
