//! A deterministic simulator of a replicated pair: two replicas with virtual disks and
//! metadata journals, a virtual etcd, a peer link that delays, duplicates, reorders, corrupts
//! and partitions, a host workload, and faults (crash, power loss, pause, partitions). Virtual
//! time; one seeded RNG; nothing real.

pub mod caw;
pub mod disk;
pub mod oracle;
mod world;

pub use world::{Faults, Knobs, Outcome, Script, World};
