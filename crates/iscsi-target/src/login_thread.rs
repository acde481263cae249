//! The login thread: every portal's accept loop and every connection's login phase run on one
//! thread of their own, with a runtime of its own, and a connection moves to the serving
//! runtime only once its login has completed (LIO's login thread does the same).
//!
//! A flood of connections that never log in (2,000 idle sockets, slow one-byte-a-second
//! logins, a port scanner) is then accepted, timed and dropped there: its thousands of tasks
//! and timers never sit in the run queues of the workers that carry the sessions' commands, so
//! a session in full-feature phase is not delayed behind them. The thread runs at a lower
//! scheduling priority (nice +5 relative to the process) so that on a saturated machine the
//! data path is served first; a login still gets a third of a CPU's weight, far more than the
//! login phase needs.
//!
//! One thread serves every server of the process. A portal's accept loop ends when its stop
//! token is cancelled: explicitly (portal removed, shutdown) or when the runtime that serves
//! its sessions shuts down (`stop_with_runtime`), so a server dropped with its runtime closes
//! its listening sockets as before.

use std::future::Future;
use std::sync::OnceLock;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// How much lower the login thread's priority is than the process's.
const NICE: i32 = 5;

/// The login thread's runtime, started on first use; `None` if it could not be started (the
/// caller then runs the login phase on its own runtime).
pub(crate) fn handle() -> Option<&'static Handle> {
    static LOGIN: OnceLock<Option<Handle>> = OnceLock::new();
    LOGIN.get_or_init(start).as_ref()
}

fn start() -> Option<Handle> {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            warn!(
                "could not start the login thread's runtime ({e}); logins run beside the sessions"
            );
            return None;
        }
    };
    let handle = runtime.handle().clone();
    let spawned = std::thread::Builder::new()
        .name("lanes-login".into())
        .spawn(move || {
            lower_priority();
            runtime.block_on(std::future::pending::<()>());
        });
    match spawned {
        Ok(_) => Some(handle),
        Err(e) => {
            warn!("could not start the login thread ({e}); logins run beside the sessions");
            None
        }
    }
}

/// Lowers this thread's priority by `NICE` (a thread's nice value is its own on Linux).
/// Raising the nice value needs no privilege; if it fails anyway, the thread runs at the
/// process's priority.
fn lower_priority() {
    let current = rustix::process::getpriority_process(None).unwrap_or(0);
    let tid = rustix::thread::gettid();
    let _ = rustix::process::setpriority_process(Some(tid), current.saturating_add(NICE));
}

/// Runs `future` on the login thread, or on the current runtime without one.
pub(crate) fn spawn<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match handle() {
        Some(h) => drop(h.spawn(future)),
        None => drop(tokio::spawn(future)),
    }
}

/// Cancels `stop` when the current runtime shuts down (its tasks are dropped then), so what
/// runs on the login thread for that runtime's server ends with it.
pub(crate) fn stop_with_runtime(stop: &CancellationToken) {
    let guard = stop.clone().drop_guard();
    let stopped = stop.clone();
    tokio::spawn(async move {
        let _guard = guard;
        stopped.cancelled().await;
    });
}
