//! An SMB 3.1.1 client on the sans-IO `smb-proto` crate: a thin tokio driver that connects,
//! negotiates (signing with AES-GMAC or AES-CMAC, optional AES-GCM encryption), signs in with
//! NTLMv2, binds more channels to the session (multichannel) and keeps many requests in
//! flight on each. It is what `lanes bench smb://` and `lanes doctor smb://` measure with.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lanes_smb_client::SmbError> {
//! use lanes_smb_client::{ClientConfig, OpenOptions, Session};
//! let s = Session::connect("127.0.0.1:445".parse().unwrap(), ClientConfig::new("alice", "pw")).await?;
//! s.bind_channel("127.0.0.2:445".parse().unwrap()).await?;
//! let tree = s.tree_connect("127.0.0.1", "share").await?;
//! let f = tree.open("file.bin", OpenOptions::READ_WRITE).await?;
//! f.write_at(0, b"hello").await?;
//! assert_eq!(&f.read_at(0, 5).await?[..], b"hello");
//! f.close().await
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod bench;
mod channel;
pub mod doctor;
mod error;
mod failover;
mod file;
mod session;
pub mod url;

pub use channel::ChannelCounters;
pub use error::SmbError;
pub use file::{File, OpenOptions, Tree};
pub use session::{ChannelInfo, ClientConfig, Session, DEFAULT_CHANNEL_TIMEOUT};
pub use smb_proto::msg::ioctl::NetworkInterface;
