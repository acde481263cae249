//! Test harness: an NBD server over a [`MemoryDevice`] on its own runtime, a tool check, and a
//! minimal NBD client built on the crate's codec.
#![allow(dead_code)]

pub mod client;
pub mod devices;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use lanes_export::{Device, ExportError, MemoryDevice, NbdListen, NbdOptions, NbdServer};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

pub const EXPORT: &str = "export";

/// Fails the test with a clear message when a tool the test needs is not installed.
pub fn require_tool(tool: &str, package: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "this test needs `{tool}` (Debian package {package}); scripts/test.sh installs it"
    );
}

/// Runs a command, failing the test with its output if it does not succeed.
pub fn run(cmd: &mut Command) -> String {
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{cmd:?} failed with {}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A served device; dropping it shuts the server down.
pub struct Served<D: Device = MemoryDevice> {
    pub runtime: Runtime,
    pub dev: Arc<D>,
    pub addr: String,
    pub dir: tempfile::TempDir,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), ExportError>>>,
}

pub enum On {
    Unix,
    Tcp,
}

impl Served {
    pub fn new(dev: MemoryDevice, on: On) -> Served {
        Served::with_options(Arc::new(dev), on, NbdOptions::default())
    }
}

impl<D: Device> Served<D> {
    pub fn with_options(dev: Arc<D>, on: On, options: NbdOptions) -> Served<D> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let listen = match on {
            On::Unix => NbdListen::Unix(dir.path().join("nbd.sock")),
            On::Tcp => "127.0.0.1:0".parse().unwrap(),
        };
        let server = runtime
            .block_on(NbdServer::bind_with(&listen, EXPORT, options))
            .unwrap();
        let addr = server.local_addr();
        let (tx, rx) = oneshot::channel::<()>();
        let task = runtime.spawn(server.serve(Arc::clone(&dev), async move {
            rx.await.ok();
        }));
        Served {
            runtime,
            dev,
            addr,
            dir,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    /// The libnbd / QEMU URI of the export.
    pub fn uri(&self) -> String {
        match self.addr.strip_prefix("unix:") {
            Some(path) => format!("nbd+unix:///{EXPORT}?socket={path}"),
            None => format!("nbd://{}/{EXPORT}", self.addr),
        }
    }

    pub fn socket_path(&self) -> Option<PathBuf> {
        self.addr.strip_prefix("unix:").map(PathBuf::from)
    }

    /// Shuts the server down and returns what `serve` returned.
    pub fn stop(&mut self) -> Result<(), ExportError> {
        if let Some(tx) = self.shutdown.take() {
            tx.send(()).ok();
        }
        match self.task.take() {
            Some(task) => self.runtime.block_on(task).unwrap(),
            None => Ok(()),
        }
    }
}

impl<D: Device> Drop for Served<D> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}
