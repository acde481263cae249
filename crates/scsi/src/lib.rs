//! Sans-IO SCSI target emulation (SPC-4, SBC-3) over a [`blockstore::BlockDevice`].
//!
//! The target driver decodes iSCSI, then calls [`LunMap::execute`] (or
//! [`LogicalUnit::execute`]) on a blocking thread with a [`ScsiRequest`]; the data-in payload is
//! appended to a caller-owned buffer and the status/sense come back as a [`ScsiOutcome`].
//! Logical units are `Send + Sync` and take no global lock on the READ/WRITE path.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod aio;
pub mod alua;
mod caw_lock;
pub mod cdb;
mod command;
mod drain;
mod inquiry;
mod io;
mod lun;
mod lunmap;
mod mode;
mod opcodes;
mod pr;
mod pr_out;
mod pr_store;
pub mod sense;
mod ua;
mod xcopy;

pub use alua::{AluaState, PortGroup, TargetPortGroups};
pub use cdb::{decode_cdb, BlockRange, Command};
pub use lun::{LogicalUnit, LunConfig};
pub use lunmap::LunMap;
pub use pr_store::{NoticeFn, PrChangeFn, PrStore, StoreResult};
pub use sense::{status, Sense};

use std::sync::Arc;

/// One I_T nexus: one iSCSI session.
#[derive(Debug, Clone)]
pub struct Nexus {
    /// Unique per session for the life of the process.
    pub id: u64,
    /// iSCSI initiator name.
    pub initiator_name: Arc<str>,
    /// Initiator session id.
    pub isid: [u8; 6],
    /// Relative target port (one per portal group), 1-based.
    pub relative_target_port: u16,
    /// ALUA target port group of that port.
    pub target_port_group: u16,
}

impl Nexus {
    /// Initiator port name in iSCSI TransportID form (SPC-4 7.6.4.6): `<name>,i,0x<isid>`.
    pub fn initiator_port_name(&self) -> String {
        let mut s = format!("{},i,0x", self.initiator_name);
        for b in self.isid {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

/// SAM-5 task attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskAttribute {
    /// SIMPLE.
    Simple,
    /// ORDERED.
    Ordered,
    /// HEAD OF QUEUE.
    HeadOfQueue,
    /// ACA.
    Aca,
}

/// One SCSI command as delivered by the transport.
#[derive(Debug)]
pub struct ScsiRequest<'a> {
    /// The nexus it arrived on.
    pub nexus: &'a Nexus,
    /// LUN (SAM-5 flat form as the transport decoded it).
    pub lun: u64,
    /// The CDB bytes (may carry trailing padding).
    pub cdb: &'a [u8],
    /// Data-out segments in order; their total is what the initiator sent (≤ EDTL).
    pub data_out: &'a [bytes::Bytes],
    /// Expected data transfer length for data-in.
    pub data_in_limit: u32,
    /// Task attribute.
    pub attr: TaskAttribute,
}

/// Status and sense of a completed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiOutcome {
    /// SCSI status byte (see [`status`]).
    pub status: u8,
    /// Sense data for CHECK CONDITION.
    pub sense: Option<Sense>,
}

impl ScsiOutcome {
    /// GOOD.
    pub const fn good() -> Self {
        Self {
            status: status::GOOD,
            sense: None,
        }
    }
    /// CHECK CONDITION with `sense`.
    pub const fn check(sense: Sense) -> Self {
        Self {
            status: status::CHECK_CONDITION,
            sense: Some(sense),
        }
    }
    /// RESERVATION CONFLICT.
    pub const fn conflict() -> Self {
        Self {
            status: status::RESERVATION_CONFLICT,
            sense: None,
        }
    }
    /// Fixed-format sense bytes, if any (what goes in the iSCSI SCSI Response data segment).
    pub fn sense_bytes(&self) -> Option<[u8; 18]> {
        self.sense.map(|s| s.to_fixed_bytes())
    }
}

impl From<Result<(), Sense>> for ScsiOutcome {
    fn from(r: Result<(), Sense>) -> Self {
        match r {
            Ok(()) => Self::good(),
            Err(s) => Self::check(s),
        }
    }
}

/// Errors creating a logical unit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Block size not 512 or 4096, or device smaller than one block.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Persisted reservation state could not be read or parsed.
    #[error("persistent reservation file {path}: {reason}")]
    PrFile {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
}

/// Copies `src` into `out` truncated to `alloc` bytes (allocation length semantics).
pub(crate) fn put_truncated(out: &mut bytes::BytesMut, src: &[u8], alloc: u32) {
    let n = src.len().min(alloc as usize);
    out.extend_from_slice(src.get(..n).unwrap_or_default());
}

/// Copies `v` into `b` at `at` if it fits (never panics).
pub(crate) fn put(b: &mut [u8], at: usize, v: &[u8]) {
    if let Some(d) = b.get_mut(at..at.saturating_add(v.len())) {
        d.copy_from_slice(v);
    }
}

/// Concatenates data-out segments (only for small parameter lists).
pub(crate) fn gather(data: &[bytes::Bytes], max: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for seg in data {
        let room = max.saturating_sub(v.len());
        v.extend_from_slice(seg.get(..seg.len().min(room)).unwrap_or_default());
    }
    v
}

#[cfg(test)]
mod tests;
