//! placeholder
pub mod config;
