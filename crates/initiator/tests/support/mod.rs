//! Test helpers shared by the initiator's integration tests.
#![allow(dead_code)]
pub mod proxy;
