//! The systemd readiness protocol (sd_notify(3)): state lines such as `READY=1` sent as one
//! datagram to the unix socket named by `$NOTIFY_SOCKET`, so a `Type=notify` unit counts as
//! started only once `lanes serve` listens on every portal (or `lanes attach` exports its
//! device). A name starting with `@` is a socket in the abstract namespace (the `@` stands for
//! the leading NUL byte). Without `$NOTIFY_SOCKET` (not under systemd) nothing is sent.
//!
//! Also the stop signals, which must be handled before READY=1 goes out.

use std::ffi::OsStr;
use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The service manager's socket, if `$NOTIFY_SOCKET` names one.
fn socket_address(name: &OsStr) -> io::Result<SocketAddr> {
    use std::os::unix::ffi::OsStrExt as _;
    let bytes = name.as_bytes();
    match bytes.split_first() {
        Some((b'@', abstract_name)) => {
            use std::os::linux::net::SocketAddrExt as _;
            SocketAddr::from_abstract_name(abstract_name)
        }
        Some((b'/', _)) => SocketAddr::from_pathname(name),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("NOTIFY_SOCKET={name:?} is neither a path nor an @abstract name"),
        )),
    }
}

/// Sends `state` (newline-separated `KEY=VALUE` lines) to the service manager. Returns
/// `Ok(false)` when not started by one.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(name) = std::env::var_os("NOTIFY_SOCKET").filter(|n| !n.is_empty()) else {
        return Ok(false);
    };
    let address = socket_address(&name)?;
    let socket = UnixDatagram::unbound()?;
    let sent = socket.send_to_addr(state.as_bytes(), &address)?;
    if sent != state.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short datagram to NOTIFY_SOCKET",
        ));
    }
    Ok(true)
}

/// Installs SIGINT and SIGTERM handlers now, before readiness is announced (a service manager
/// may stop a unit the moment it is ready, and the default action would end the process without
/// draining); the future completes when either arrives.
pub fn stop_signal() -> io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

/// [`notify`], with a failure logged rather than returned: the service manager not hearing
/// from us must not stop the target (systemd then reports the start as timed out).
pub fn notify_or_log(state: &str) {
    if let Err(e) = notify(state) {
        tracing::warn!("telling the service manager {state:?}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_and_abstract_names() {
        let path = socket_address(OsStr::new("/run/systemd/notify")).unwrap();
        assert_eq!(
            path.as_pathname(),
            Some(std::path::Path::new("/run/systemd/notify"))
        );
        use std::os::linux::net::SocketAddrExt as _;
        let abstract_address = socket_address(OsStr::new("@lanes/notify")).unwrap();
        assert_eq!(
            abstract_address.as_abstract_name(),
            Some(&b"lanes/notify"[..])
        );
        assert!(socket_address(OsStr::new("relative")).is_err());
    }

    #[test]
    fn datagram_reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("lanes-notify-test-{}", std::process::id());
        let receiver =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        let address = socket_address(OsStr::new(&format!("@{name}"))).unwrap();
        UnixDatagram::unbound()
            .unwrap()
            .send_to_addr(b"READY=1", &address)
            .unwrap();
        let mut buffer = [0u8; 64];
        let n = receiver.recv(&mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"READY=1");
    }
}
