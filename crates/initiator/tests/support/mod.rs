//! Test helpers shared by the initiator's integration tests.
pub mod proxy;
