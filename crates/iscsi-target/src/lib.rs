//! `lanes serve`: the tokio driver that runs `iscsi-proto` and `scsi` over TCP. It binds every
//! portal, runs logins, orders commands by CmdSN across the connections of a session (MC/S),
//! executes them on the blocking pool against the logical units, and answers with one
//! vectored write per batch of responses.

pub mod config;
mod connection;
mod data_in;
mod exec;
mod limits;
mod listen;
mod login_phase;
mod login_thread;
mod pair;
pub mod pair_pr;
mod pool;
mod portals;
pub mod reload;
mod send_queue;
mod server;
mod session;
mod stats;
mod status;
mod storage_size;
mod target;
mod text;
mod tmf;
mod write_lanes;
mod writer;

pub use reload::{Change, ConfigSource, PreparedSection, ReloadError, ReloadReport, ReloadSection};
pub use server::Portal;
pub use status::StatusSection;
pub use target::{BuildError, TargetRuntime, INQUIRY_PRODUCT, INQUIRY_VENDOR};

use config::ServeConfig;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::oneshot;
use tracing::{error, info, warn};

/// How long shutdown waits for running commands before it stops replicated LUNs under them.
const DRAIN_AT_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(10);

/// What a started server reports once every portal is bound.
#[derive(Debug, Clone)]
pub struct ServeInfo {
    /// (TPGT, address) of every portal, wildcard addresses expanded to this host's addresses.
    pub portals: Vec<(u16, SocketAddr)>,
    /// Expanded wildcard addresses on an interface that holds a default route (management).
    pub management: Vec<SocketAddr>,
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

/// Runs the target until SIGINT or SIGTERM; SIGHUP reloads the configuration from `source`.
/// `ready` receives the bound portals and LUN identities once the server accepts connections.
pub async fn serve(
    config: ServeConfig,
    source: ConfigSource,
    ready: oneshot::Sender<ServeInfo>,
) -> Result<(), Error> {
    serve_with(config, source, ready, OtherServices::default()).await
}

/// Other services of the process (SMB): their parts of the status reply and `/metrics`, and
/// of a reload.
#[derive(Default)]
pub struct OtherServices {
    pub status: Vec<Arc<dyn StatusSection>>,
    pub reload: Vec<Arc<dyn ReloadSection>>,
}

/// [`serve`], with other services of the process (SMB) reporting through the same status
/// socket and `/metrics`, and reconfigured by the same reloads.
pub async fn serve_with(
    config: ServeConfig,
    source: ConfigSource,
    ready: oneshot::Sender<ServeInfo>,
    others: OtherServices,
) -> Result<(), Error> {
    // Handlers first: a signal that arrives as soon as `ready` is announced (a service manager
    // reloading or stopping a just-started unit) must find them installed, not take its
    // default action (SIGHUP and SIGTERM would end the process without draining).
    let signals = ShutdownSignals::install();
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    let handle = start_full(config, source, others.status).await?;
    for section in others.reload {
        handle.add_reload_section(section);
    }
    let _ = ready.send(handle.info.clone());
    let reloads = tokio::spawn(reload_on_sighup(handle.server.clone(), hangup));
    signals.wait().await;
    reloads.abort();
    info!("shutting down");
    handle.stop().await;
    Ok(())
}

async fn reload_on_sighup(
    server: Arc<server::Server>,
    hangup: std::io::Result<tokio::signal::unix::Signal>,
) {
    let mut hangup = match hangup {
        Ok(s) => s,
        Err(e) => {
            warn!("cannot watch SIGHUP, reload only through the status socket: {e}");
            return;
        }
    };
    while hangup.recv().await.is_some() {
        info!("SIGHUP: reloading the configuration");
        // The outcome is logged by the reload itself.
        let _ = reload::reload(&server).await;
    }
}

/// A running server (tests start and stop it without signals).
pub struct ServerHandle {
    pub info: ServeInfo,
    server: Arc<server::Server>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Opens the storage, binds every portal and starts accepting; a reload has no file to
/// re-read ([`ConfigSource::Fixed`]).
pub async fn start(config: ServeConfig) -> Result<ServerHandle, Error> {
    start_with(config, ConfigSource::Fixed).await
}

/// [`start`], with the source a reload re-reads the configuration from.
pub async fn start_with(config: ServeConfig, source: ConfigSource) -> Result<ServerHandle, Error> {
    start_full(config, source, Vec::new()).await
}

/// [`start_with`], with status sections of other services.
pub async fn start_full(
    config: ServeConfig,
    source: ConfigSource,
    sections: Vec<Arc<dyn StatusSection>>,
) -> Result<ServerHandle, Error> {
    config.prepare_storage().map_err(Error::Storage)?;
    let mut targets = Vec::new();
    for t in &config.targets {
        targets.push(Arc::new(TargetRuntime::build(&config, t)?));
    }
    limits::raise_open_files_limit(config.limits.connections);
    let mut bound = Vec::new();
    for group in &config.portal_groups {
        for addr in &group.portals {
            let (portal, listener) = listen::bind(group.tag, *addr, &config.limits).await?;
            bound.push((*addr, portal, listener));
        }
    }
    let server = Arc::new(server::Server::new(config, source, targets).with_sections(sections));
    {
        let mut listeners = server.listeners.lock();
        for (configured, portal, listener) in bound {
            listeners.push(listen::spawn(&server, configured, portal, listener));
        }
    }
    server.refresh_portals();
    let expanded = portals::expand(server.portals.read().iter().copied());
    let info = ServeInfo {
        portals: expanded.portals.iter().map(|p| (p.tpgt, p.addr)).collect(),
        management: expanded.management,
        targets: server
            .targets
            .iter()
            .map(|t| (t.name.clone(), t.wwids()))
            .collect(),
    };
    let mut tasks = vec![
        tokio::spawn(limits::report_loop(server.clone())),
        tokio::spawn(storage_size::follow_loop(server.clone())),
    ];
    tasks.extend(status::start(&server).await?);
    Ok(ServerHandle {
        info,
        server,
        tasks,
    })
}

impl ServerHandle {
    /// Re-reads the configuration and applies the difference (see [`reload`]).
    pub async fn reload(&self) -> Result<ReloadReport, ReloadError> {
        reload::reload(&self.server).await
    }

    /// Lets a reload reconfigure another service of the process too.
    pub fn add_reload_section(&self, section: Arc<dyn ReloadSection>) {
        self.server.reload_sections.lock().push(section);
    }

    /// The configuration the server runs now.
    pub fn running_config(&self) -> Arc<ServeConfig> {
        self.server.config()
    }

    /// (TPGT, bound address) of every portal listening now (as bound, wildcards unexpanded).
    pub fn listening(&self) -> Vec<(u16, SocketAddr)> {
        let listeners = self.server.listeners.lock();
        listeners
            .iter()
            .map(|l| (l.portal.tpgt, l.portal.addr))
            .collect()
    }

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
        let drain_all = || async {
            for s in &sessions {
                s.drain().await;
            }
        };
        if tokio::time::timeout(DRAIN_AT_SHUTDOWN, drain_all())
            .await
            .is_err()
        {
            // Only a replicated LUN holds commands this long: writes it may not acknowledge
            // without its peer and its witness. Stopping it fails them (they were never
            // acknowledged), and then the sessions drain.
            warn!(
                "commands still running {} s into shutdown: stopping the replicated LUNs, which \
                 fails the writes they hold",
                DRAIN_AT_SHUTDOWN.as_secs()
            );
            for t in &self.server.targets {
                for (_, pair) in &t.pairs {
                    pair.shutdown().await;
                }
            }
            drain_all().await;
        }
        // The portals' sockets close on the login thread: once `stop` returns, their ports
        // are free to bind again.
        let listeners: Vec<_> = std::mem::take(&mut *self.server.listeners.lock());
        for listener in &listeners {
            listener
                .wait_closed(std::time::Duration::from_secs(10))
                .await;
        }
        for t in &self.server.targets {
            for (lun, lu) in t.luns.load().luns() {
                let device = lu.config().device.clone();
                // A replicated LUN without its peer and its witness holds a flush until one
                // returns: shutting down does not wait for that forever.
                let flushed = tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    tokio::task::spawn_blocking(move || device.flush()),
                )
                .await;
                match flushed {
                    Ok(Ok(Err(e))) => {
                        error!(target = %t.name, lun, "flush at shutdown failed: {e}")
                    }
                    Err(_) => error!(target = %t.name, lun, "flush at shutdown did not finish"),
                    _ => {}
                }
            }
            for (_, pair) in &t.pairs {
                pair.shutdown().await;
            }
        }
    }
}

/// The signals `serve` handles, installed before the server announces that it is ready.
struct ShutdownSignals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    fn install() -> ShutdownSignals {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(stream) => Some(stream),
            Err(e) => {
                error!("cannot handle {name}: {e}");
                None
            }
        };
        ShutdownSignals {
            interrupt: install(SignalKind::interrupt(), "SIGINT"),
            terminate: install(SignalKind::terminate(), "SIGTERM"),
        }
    }

    /// Returns on SIGINT or SIGTERM (SIGHUP is the reload task's).
    async fn wait(mut self) {
        async fn next(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
            signal.as_mut()?.recv().await
        }
        tokio::select! {
            Some(()) = next(&mut self.interrupt) => {}
            Some(()) = next(&mut self.terminate) => {}
            // None could be installed: SIGINT and SIGTERM keep their default action and end
            // the process.
            else => std::future::pending::<()>().await,
        }
    }
}
