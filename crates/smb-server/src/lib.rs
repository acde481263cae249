//! lanes serve's SMB 3.1.1 file server: the tokio driver around the sans-IO `smb-proto` crate.
//! A listener per address, a task per connection; sessions are shared by their channels
//! (multichannel), shares are directories on the server's filesystem.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod asyncop;
pub mod config;
pub mod conn;
pub mod dispatch;
pub mod fs;
pub mod ioctl;
pub mod reload;
pub mod session;
pub mod state;
pub mod stats;
pub mod tree;
pub mod users;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;

pub use config::{ShareConfig, SmbConfig};
pub use reload::{PreparedReload, ReloadRefused};
pub use users::Users;

use state::{Server, Share};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("share {name}: {path}: {source}")]
    Share {
        name: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("share {name}: {path} is not a directory")]
    NotADirectory { name: String, path: String },
    #[error("SMB listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Users(#[from] users::UsersError),
}

/// A running SMB server: its bound addresses and a handle to stop it.
pub struct SmbServer {
    pub addrs: Vec<SocketAddr>,
    pub server: Arc<Server>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl SmbServer {
    /// Checks the shares, binds every listen address and starts accepting.
    pub async fn start(config: SmbConfig, users: Users) -> Result<SmbServer, ServeError> {
        let shares = build_shares(&config)?;
        let mut listeners = Vec::new();
        for addr in &config.listen {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Listen {
                    addr: *addr,
                    source,
                })?;
            listeners.push(l);
        }
        let mut addrs = Vec::new();
        for l in &listeners {
            if let Ok(a) = l.local_addr() {
                addrs.push(a);
            }
        }
        let mut config = config;
        // Ports chosen by the system (port 0) are reported as bound.
        config.listen = addrs.clone();
        let server = Arc::new(Server::new(config, shares, users));
        let mut tasks = Vec::new();
        for l in listeners {
            let server = server.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    match l.accept().await {
                        Ok((stream, peer)) => {
                            tokio::spawn(conn::serve_connection(server.clone(), stream, peer));
                        }
                        Err(e) => {
                            tracing::warn!("SMB accept: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                    }
                }
            }));
        }
        for a in &addrs {
            tracing::info!("SMB listening on {a}");
        }
        Ok(SmbServer {
            addrs,
            server,
            tasks,
        })
    }

    /// Stops accepting (connections already open run on until their peers leave).
    pub fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for SmbServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The configured shares, each root checked to be a directory and made canonical.
pub(crate) fn build_shares(config: &SmbConfig) -> Result<Vec<Arc<Share>>, ServeError> {
    let mut shares = Vec::new();
    for s in &config.shares {
        let err = |source| ServeError::Share {
            name: s.name.clone(),
            path: s.path.display().to_string(),
            source,
        };
        let root = std::fs::canonicalize(&s.path).map_err(err)?;
        if !root.is_dir() {
            return Err(ServeError::NotADirectory {
                name: s.name.clone(),
                path: s.path.display().to_string(),
            });
        }
        shares.push(Arc::new(Share::new(
            s.name.clone(),
            root,
            s.read_only,
            s.users.clone(),
        )));
    }
    Ok(shares)
}
