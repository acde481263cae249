//! lanes' device exports: an NBD server (newstyle fixed handshake) and a FUSE file, both over
//! the [`Device`] trait that lanes' multipath device implements.
//!
//! - [`NbdServer`] serves one export on a unix socket or a loopback TCP port; the protocol
//!   itself lives in the sans-IO [`nbd::proto`] (messages) and [`nbd::handshake`] (option
//!   haggling) modules, the tokio driver in [`nbd::server`] and `nbd::connection`.
//! - [`FuseExport`] mounts a directory holding one regular file, `disk`.
//! - [`aligned`] turns byte-granular requests into block-aligned device calls (read-modify-write
//!   of edge blocks under a range lock); both exports go through it.
//! - [`MemoryDevice`] is a sparse in-memory [`Device`] for tests and demos.
#![deny(clippy::unwrap_used, clippy::indexing_slicing)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod aligned;
mod device;
mod fuse;
mod memory;
pub mod nbd;
mod range_lock;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

pub use device::Device;
pub use fuse::{FuseExport, FuseOptions};
pub use memory::{MemoryDevice, MemoryStats};
pub use nbd::server::{NbdListen, NbdOptions, NbdServer};

/// What can go wrong setting up or running an export. Client misbehaviour never shows up here:
/// it is answered on the wire (an NBD error reply or a disconnect, a FUSE errno).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A listen address that is neither `unix:/path` nor `IP:PORT`.
    #[error("invalid NBD listen address {0:?} (expected unix:/path or IP:PORT)")]
    InvalidListen(String),
    /// A TCP address outside 127.0.0.0/8 and ::1 without `allow_remote`: NBD has no
    /// authentication, so the device would be open to the network.
    #[error("refusing to serve NBD on non-loopback address {0} (NBD has no authentication; allow remote clients explicitly)")]
    RemoteRefused(SocketAddr),
    /// The unix socket path is held by a live server.
    #[error("NBD socket {0} is in use by another server")]
    SocketInUse(PathBuf),
    /// The device cannot be exported as it is (block size, size).
    #[error("device cannot be exported: {0}")]
    InvalidDevice(String),
    /// The export name cannot be sent in the protocol.
    #[error("invalid export name: {0}")]
    InvalidExportName(String),
    /// A local I/O failure, with what was being done.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl ExportError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        ExportError::Io {
            context: context.into(),
            source,
        }
    }
}
