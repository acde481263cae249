//! `lanes serve`: the tokio driver that runs `iscsi-proto` and `scsi` over TCP. It binds every
//! portal, runs logins, orders commands by CmdSN across the connections of a session (MC/S),
//! executes them on the blocking pool against the logical units, and answers with one
//! vectored write per batch of responses.

pub mod config;
mod connection;
mod exec;
mod limits;
mod login_phase;
mod pool;
mod portals;
mod send_queue;
mod server;
mod session;
mod stats;
mod status;
mod target;
mod text;
mod tmf;
mod writer;

pub use server::Portal;
pub use target::{BuildError, TargetRuntime};

use config::ServeConfig;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tracing::{error, info};

/// What a started server reports once every portal is bound.
#[derive(Debug, Clone)]
pub struct ServeInfo {
    /// (TPGT, address) of every portal, wildcard addresses expanded to this host's addresses.
    pub portals: Vec<(u16, SocketAddr)>,
    /// (target IQN, [(LUN, WWID)]).
    pub targets: Vec<(String, Vec<(u64, String)>)>,
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("preparing storage")]
    Storage(#[source] std::io::Error),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("status socket {path}")]
    Status {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Runs the target until SIGINT or SIGTERM. `ready` receives the bound portals and LUN
/// identities once the server accepts connections.
pub async fn serve(config: ServeConfig, ready: oneshot::Sender<ServeInfo>) -> Result<(), Error> {
    let handle = start(config).await?;
    let _ = ready.send(handle.info.clone());
    shutdown_signal().await;
    info!("shutting down");
    handle.stop().await;
    Ok(())
}

/// A running server (tests start and stop it without signals).
pub struct ServerHandle {
    pub info: ServeInfo,
    server: Arc<server::Server>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Opens the storage, binds every portal and starts accepting.
pub async fn start(config: ServeConfig) -> Result<ServerHandle, Error> {
    config.prepare_storage().map_err(Error::Storage)?;
    let mut targets = Vec::new();
    for t in &config.targets {
        targets.push(Arc::new(TargetRuntime::build(&config, t)?));
    }
    let mut listeners = Vec::new();
    for group in &config.portal_groups {
        for addr in &group.portals {
            let l = limits::listen(*addr, &config.limits).map_err(|source| Error::Bind {
                addr: *addr,
                source,
            })?;
            let bound = l.local_addr().unwrap_or(*addr);
            listeners.push((
                Portal {
                    tpgt: group.tag,
                    addr: bound,
                },
                l,
            ));
        }
    }
    let portals = portals::expand(listeners.iter().map(|(p, _)| *p));
    let info = ServeInfo {
        portals: portals.iter().map(|p| (p.tpgt, p.addr)).collect(),
        targets: targets
            .iter()
            .map(|t| (t.config.name.clone(), t.wwids.clone()))
            .collect(),
    };
    limits::raise_open_files_limit(config.limits.connections);
    let server = Arc::new(server::Server::new(config, targets, portals));
    let mut tasks = vec![tokio::spawn(limits::report_loop(server.clone()))];
    for (portal, listener) in listeners {
        let server = server.clone();
        tasks.push(tokio::spawn(accept_loop(server, portal, listener)));
    }
    tasks.extend(status::start(&server).await?);
    Ok(ServerHandle {
        info,
        server,
        tasks,
    })
}

impl ServerHandle {
    /// Stops accepting, ends every session, waits for running commands and flushes the LUNs.
    pub async fn stop(self) {
        self.server.shutdown.cancel();
        for t in &self.tasks {
            t.abort();
        }
        let sessions: Vec<_> = self
            .server
            .sessions
            .lock()
            .by_tsih
            .values()
            .cloned()
            .collect();
        for s in &sessions {
            s.close_all();
        }
        for s in &sessions {
            s.drain().await;
        }
        for t in &self.server.targets {
            for (lun, lu) in t.luns.luns() {
                if let Err(e) = lu.config().device.flush() {
                    error!(target = %t.config.name, lun, "flush at shutdown failed: {e}");
                }
            }
        }
    }
}

async fn accept_loop(server: Arc<server::Server>, portal: Portal, listener: TcpListener) {
    let open_on_portal = Arc::default();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    // Over a connection limit the socket is closed at once (dropped here).
                    if let Some(slot) = server.limits.admit(&open_on_portal, peer.ip()) {
                        let server = server.clone();
                        tokio::spawn(async move {
                            connection::run(server, stream, portal, peer).await;
                            drop(slot);
                        });
                    }
                }
                Err(e) => {
                    error!(portal = %portal.addr, "accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            _ = server.shutdown.cancelled() => return,
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
