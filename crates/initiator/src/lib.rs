//! lanes' own iSCSI initiator: URL parsing, discovery, login (none or one-way CHAP) and a
//! session that pipelines SCSI commands up to the target's CmdSN window.
//!
//! The protocol pieces are sans-IO ([`login`] here, PDUs, text keys and CHAP in `iscsi-proto`);
//! [`Session`] is the tokio driver: one reader task demultiplexes responses by ITT to the waiting
//! commands, one writer task sends every PDU in CmdSN order.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod cdb;
mod commands;
mod connection;
mod error;
pub mod identify;
pub mod login;
pub mod multipath;
mod session;
mod url;

pub use error::{chain, Error};
pub use identify::{DeviceIdentity, PortGroupState};
pub use login::{ChapSecret, Negotiated, Offer};
pub use multipath::{Multipath, MultipathConfig, MultipathStatus, PortalConfig};
pub use session::{
    discover, random_isid, resolve, LoginOptions, ScsiOutcome, Session, CONNECT_TIMEOUT,
};
pub use url::{IscsiUrl, UrlError};
