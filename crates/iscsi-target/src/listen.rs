//! Portal listeners: binding, the accept loops, and stopping one portal while the server runs.

use crate::config::LimitsConfig;
use crate::login_thread;
use crate::server::{Portal, Server};
use crate::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// One listening portal.
pub struct Listener {
    /// The address as configured (port 0 and wildcard addresses as written).
    pub configured: SocketAddr,
    /// Its portal group and the address actually bound.
    pub portal: Portal,
    /// Cancelled to stop accepting on this portal (a child of the server's shutdown token).
    pub stop: CancellationToken,
    /// Cancelled once the accept loop has ended and the listening socket is closed: the
    /// loop runs on the login thread, so `stop` alone does not say the port is free.
    pub closed: CancellationToken,
}

impl Listener {
    /// Waits until the listening socket is closed (after `stop`), at most `within`; logs an
    /// error if it was not.
    pub async fn wait_closed(&self, within: std::time::Duration) {
        if tokio::time::timeout(within, self.closed.cancelled())
            .await
            .is_err()
        {
            error!(portal = %self.portal.addr, "the portal's socket did not close within {} s", within.as_secs());
        }
    }

    /// Whether a connection whose local address is `local` was accepted here: a wildcard
    /// listener accepts on every address of its port.
    pub fn accepted(&self, local: SocketAddr) -> bool {
        let bound = self.portal.addr;
        bound.port() == local.port()
            && (bound.ip() == local.ip()
                || (bound.ip().is_unspecified() && bound.is_ipv4() == local.is_ipv4()))
    }
}

/// Binds a portal of group `tpgt` (its accept queue sized by `[limits]`).
pub async fn bind(
    tpgt: u16,
    addr: SocketAddr,
    limits: &LimitsConfig,
) -> Result<(Portal, TcpListener), Error> {
    let listener =
        crate::limits::listen(addr, limits).map_err(|source| Error::Bind { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    Ok((Portal { tpgt, addr: bound }, listener))
}

/// Starts accepting on a bound portal: the accept loop and the login phases run on the login
/// thread (`login_thread`), the sessions on the current runtime.
pub fn spawn(
    server: &Arc<Server>,
    configured: SocketAddr,
    portal: Portal,
    listener: TcpListener,
) -> Listener {
    let stop = server.shutdown.child_token();
    login_thread::stop_with_runtime(&stop);
    let serving = Handle::current();
    let closed = CancellationToken::new();
    // Dropped, so `closed` cancelled, after the accept loop and its socket, or at once if the
    // loop never starts.
    let closing = closed.clone().drop_guard();
    let accepting = (server.clone(), stop.clone());
    match listener.into_std() {
        Ok(std_listener) => login_thread::spawn(async move {
            let _closing = closing;
            let (server, stop) = accepting;
            match TcpListener::from_std(std_listener) {
                Ok(listener) => accept_loop(server, portal, listener, stop, serving).await,
                Err(e) => error!(portal = %portal.addr, "cannot listen on the login thread: {e}"),
            }
        }),
        Err(e) => {
            drop(closing);
            error!(portal = %portal.addr, "cannot hand the listener to the login thread: {e}")
        }
    }
    Listener {
        configured,
        portal,
        stop,
        closed,
    }
}

async fn accept_loop(
    server: Arc<Server>,
    portal: Portal,
    listener: TcpListener,
    stop: CancellationToken,
    serving: Handle,
) {
    let open_on_portal = Arc::default();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    // Over a connection limit the socket is closed at once (dropped here).
                    let Some(slot) = server.limits.admit(&open_on_portal, peer.ip()) else {
                        continue;
                    };
                    // A connection's close token is a child of the portal's: removing the portal
                    // ends its connections, also those still logging in.
                    let stop = stop.clone();
                    let server = server.clone();
                    let serving = serving.clone();
                    tokio::spawn(async move {
                        crate::connection::run(server, stream, portal, peer, stop, serving).await;
                        drop(slot);
                    });
                }
                Err(e) => {
                    error!(portal = %portal.addr, "accept failed: {e}");
                    tokio::select! {
                        _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
                        _ = stop.cancelled() => return,
                    }
                }
            },
            _ = stop.cancelled() => {
                if !server.shutdown.is_cancelled() {
                    info!(portal = %portal.addr, tpgt = portal.tpgt, "portal removed; no longer listening");
                }
                return;
            }
        }
    }
}
