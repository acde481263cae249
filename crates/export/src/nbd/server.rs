//! The NBD listener: binds a unix socket or a loopback TCP port, accepts clients and runs a
//! connection task for each until shutdown.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::connection::{self, Shared};
use super::handshake::ExportInfo;
use super::proto::TransmissionFlags;
use super::transmission::{Limits, MAX_PAYLOAD};
use crate::aligned::AlignedIo;
use crate::{Device, ExportError};

/// Where the NBD server listens: `unix:/path` or `IP:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdListen {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl FromStr for NbdListen {
    type Err = ExportError;

    fn from_str(s: &str) -> Result<NbdListen, ExportError> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(ExportError::InvalidListen(s.to_string()));
            }
            return Ok(NbdListen::Unix(PathBuf::from(path)));
        }
        s.parse()
            .map(NbdListen::Tcp)
            .map_err(|_| ExportError::InvalidListen(s.to_string()))
    }
}

impl fmt::Display for NbdListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NbdListen::Unix(path) => write!(f, "unix:{}", path.display()),
            NbdListen::Tcp(addr) => write!(f, "{addr}"),
        }
    }
}

/// Server settings beyond the address and export name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NbdOptions {
    /// Allow TCP addresses outside loopback. NBD has no authentication: anyone who reaches
    /// the port can read and write the device.
    pub allow_remote: bool,
    /// Clients served at once; more are closed right after accept.
    pub max_connections: usize,
    /// Requests in flight per connection.
    pub max_in_flight: usize,
    /// Payload bytes (read data and write data) in flight per connection.
    pub max_in_flight_bytes: u32,
}

impl Default for NbdOptions {
    fn default() -> NbdOptions {
        NbdOptions {
            allow_remote: false,
            max_connections: 64,
            max_in_flight: 128,
            max_in_flight_bytes: 64 << 20,
        }
    }
}

#[derive(Debug)]
enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// A bound NBD server for one export; [`serve`](NbdServer::serve) runs it.
#[derive(Debug)]
pub struct NbdServer {
    listener: Listener,
    export_name: String,
    options: NbdOptions,
}

impl NbdServer {
    /// Binds with default [`NbdOptions`] (loopback only).
    pub async fn bind(listen: &NbdListen, export_name: &str) -> Result<NbdServer, ExportError> {
        NbdServer::bind_with(listen, export_name, NbdOptions::default()).await
    }

    /// Binds, refusing non-loopback TCP addresses unless `options.allow_remote`. A unix
    /// socket left behind by a server that is gone is replaced; the new one is mode 0600.
    pub async fn bind_with(
        listen: &NbdListen,
        export_name: &str,
        options: NbdOptions,
    ) -> Result<NbdServer, ExportError> {
        // "Conventions": a string MUST NOT contain NUL and MUST be no longer than 4096 bytes.
        if export_name.len() > 4096 || export_name.contains('\0') {
            return Err(ExportError::InvalidExportName(
                "longer than 4096 bytes or contains NUL".into(),
            ));
        }
        let listener = match listen {
            NbdListen::Tcp(addr) => {
                if !addr.ip().is_loopback() && !options.allow_remote {
                    return Err(ExportError::RemoteRefused(*addr));
                }
                let listener = TcpListener::bind(addr)
                    .await
                    .map_err(|e| ExportError::io(format!("binding NBD on {addr}"), e))?;
                Listener::Tcp(listener)
            }
            NbdListen::Unix(path) => Listener::Unix(bind_unix(path).await?, path.clone()),
        };
        Ok(NbdServer {
            listener,
            export_name: export_name.to_string(),
            options,
        })
    }

    /// The bound address, `unix:/path` or `IP:PORT` (with the real port after binding port 0).
    pub fn local_addr(&self) -> String {
        match &self.listener {
            Listener::Tcp(listener) => match listener.local_addr() {
                Ok(addr) => addr.to_string(),
                Err(_) => "tcp:unknown".to_string(),
            },
            Listener::Unix(_, path) => format!("unix:{}", path.display()),
        }
    }

    /// Serves clients until `shutdown` resolves; then stops accepting, lets the requests in
    /// flight finish and be answered, closes the connections, flushes the device and returns.
    pub async fn serve<D: Device>(
        self,
        dev: Arc<D>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ExportError> {
        self.serve_aligned(Arc::new(AlignedIo::new(dev)?), shutdown)
            .await
    }

    /// [`serve`](NbdServer::serve) through an [`AlignedIo`] shared with other exports of the
    /// same device (a [`crate::FuseExport`]), so that their read-modify-writes of partial
    /// blocks are serialized against each other too.
    pub async fn serve_aligned<D: Device>(
        self,
        io: Arc<AlignedIo<D>>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ExportError> {
        let shared = Arc::new(shared_state(io, &self.export_name, &self.options));
        let connections = Arc::new(Semaphore::new(self.options.max_connections));
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        tokio::pin!(shutdown);
        tracing::info!(addr = %self.local_addr(), export = %self.export_name, "NBD server ready");
        loop {
            let accepted = tokio::select! {
                _ = &mut shutdown => break,
                accepted = self.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(stream) => stream,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "NBD accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&connections).try_acquire_owned() else {
                tracing::warn!(%peer, "NBD connection refused: too many clients");
                continue;
            };
            let shared = Arc::clone(&shared);
            let cancel = cancel.clone();
            let tasks = tracker.clone();
            tracker.spawn(async move {
                tracing::debug!(%peer, "NBD client connected");
                let result = match stream {
                    Stream::Tcp(stream) => {
                        let (r, w) = stream.into_split();
                        connection::run(r, w, shared, cancel, tasks).await
                    }
                    Stream::Unix(stream) => {
                        let (r, w) = stream.into_split();
                        connection::run(r, w, shared, cancel, tasks).await
                    }
                };
                match result {
                    Ok(()) => tracing::debug!(%peer, "NBD client disconnected"),
                    Err(e) => tracing::warn!(%peer, error = %e, "NBD connection closed"),
                }
                drop(slot);
            });
        }
        // Stop accepting now: new clients are refused instead of queueing while the others
        // finish.
        drop(self);
        cancel.cancel();
        tracker.close();
        tracker.wait().await;
        shared
            .io
            .flush()
            .await
            .map_err(|e| ExportError::io("flushing the device at NBD shutdown", e))
    }

    async fn accept(&self) -> io::Result<(Stream, String)> {
        match &self.listener {
            Listener::Tcp(listener) => {
                let (stream, peer) = listener.accept().await?;
                // Replies are written whole; there is nothing to gain from Nagle.
                stream.set_nodelay(true)?;
                Ok((Stream::Tcp(stream), peer.to_string()))
            }
            Listener::Unix(listener, path) => {
                let (stream, _) = listener.accept().await?;
                Ok((Stream::Unix(stream), format!("unix:{}", path.display())))
            }
        }
    }
}

impl Drop for NbdServer {
    /// Closes the listener and removes the unix socket file it created.
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = &self.listener {
            std::fs::remove_file(path).ok();
        }
    }
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(UnixStream),
}

/// The export as the protocol describes it, from the device's geometry.
fn shared_state<D: Device>(io: Arc<AlignedIo<D>>, name: &str, options: &NbdOptions) -> Shared<D> {
    let device = io.device();
    let minimum = device.block_size();
    let max_io = device.max_io().min(MAX_PAYLOAD);
    // "Size constraints": preferred is a power of two, at least max(minimum, 512), at most the
    // maximum payload; 64 KiB keeps small-I/O clients off read-modify-write and efficient.
    let preferred = prev_power_of_two((64 * 1024).min(max_io)).max(minimum);
    let maximum = max_io.max(preferred);
    let export = ExportInfo {
        name: name.to_string(),
        size: io.size(),
        // One coherent device without a cache of our own: flush and FUA on one connection
        // are visible on all, so CAN_MULTI_CONN holds.
        flags: TransmissionFlags::HAS_FLAGS
            | TransmissionFlags::SEND_FLUSH
            | TransmissionFlags::SEND_FUA
            | TransmissionFlags::SEND_TRIM
            | TransmissionFlags::SEND_WRITE_ZEROES
            | TransmissionFlags::CAN_MULTI_CONN,
        minimum_block: minimum,
        preferred_block: preferred,
        maximum_payload: maximum,
    };
    let limits = Limits {
        size: io.size(),
        max_payload: MAX_PAYLOAD,
    };
    let max_units = (MAX_PAYLOAD / (64 * 1024)).max(1);
    Shared {
        io,
        export,
        limits,
        max_in_flight: options.max_in_flight.max(1),
        budget_units: (options.max_in_flight_bytes / (64 * 1024)).max(max_units),
    }
}

fn prev_power_of_two(n: u32) -> u32 {
    if n == 0 {
        1
    } else {
        1 << (31 - n.leading_zeros())
    }
}

/// Binds a unix socket, replacing a stale socket file (one nobody answers on).
async fn bind_unix(path: &Path) -> Result<UnixListener, ExportError> {
    let context = || format!("binding NBD on unix:{}", path.display());
    let listener = match UnixListener::bind(path) {
        Ok(listener) => listener,
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            let is_socket = std::fs::symlink_metadata(path)
                .map(|m| m.file_type().is_socket())
                .unwrap_or(false);
            if !is_socket {
                return Err(ExportError::io(context(), e));
            }
            match UnixStream::connect(path).await {
                Ok(_) => return Err(ExportError::SocketInUse(path.to_path_buf())),
                Err(_) => {
                    std::fs::remove_file(path).map_err(|e| ExportError::io(context(), e))?;
                    UnixListener::bind(path).map_err(|e| ExportError::io(context(), e))?
                }
            }
        }
        Err(e) => return Err(ExportError::io(context(), e)),
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| ExportError::io(context(), e))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse() {
        assert_eq!(
            "unix:/run/x.sock".parse::<NbdListen>().unwrap(),
            NbdListen::Unix("/run/x.sock".into())
        );
        assert_eq!(
            "127.0.0.1:10809".parse::<NbdListen>().unwrap(),
            NbdListen::Tcp("127.0.0.1:10809".parse().unwrap())
        );
        assert_eq!(
            "[::1]:10809".parse::<NbdListen>().unwrap().to_string(),
            "[::1]:10809"
        );
        assert!("unix:".parse::<NbdListen>().is_err());
        assert!("localhost".parse::<NbdListen>().is_err());
        assert!("10809".parse::<NbdListen>().is_err());
    }

    #[test]
    fn powers_of_two() {
        assert_eq!(prev_power_of_two(65536), 65536);
        assert_eq!(prev_power_of_two(12288), 8192);
        assert_eq!(prev_power_of_two(1), 1);
    }
}
