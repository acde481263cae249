//! A `lanes serve` child process for tests, ready once its whole banner is out; the banner's
//! portals, target and WWIDs are read back. Also inside a network namespace (`ip netns exec`),
//! for lab tests. Killed (SIGKILL) on drop unless the test stopped it itself.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub use rustix::process::Signal;
use rustix::process::{kill_process, Pid};

/// How long a serve may take to print its banner (a loaded CI machine, a 256 MiB LUN).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The line that ends the banner.
const LAST_LINE: &str = "Check with";

/// How to start a `lanes serve`.
#[derive(Debug, Clone)]
pub struct ServeCommand {
    bin: OsString,
    namespace: Option<String>,
    args: Vec<OsString>,
    /// `setpriv` to this user first.
    user: Option<u32>,
    log: &'static str,
    inherit_stderr: bool,
    envs: Vec<(OsString, OsString)>,
}

/// A running `lanes serve` and what its banner said.
#[derive(Debug)]
pub struct ServeChild {
    pub child: Child,
    /// The first portal.
    pub portal: SocketAddr,
    /// Every portal, in banner order.
    pub portals: Vec<SocketAddr>,
    /// The first target's name.
    pub target: String,
    /// Every LUN's WWID, in banner order.
    pub wwids: Vec<String>,
    /// The whole banner.
    pub banner: String,
}

impl ServeCommand {
    /// `BIN serve` (pass `env!("CARGO_BIN_EXE_lanes")`).
    pub fn new(bin: impl Into<OsString>) -> Self {
        ServeCommand {
            bin: bin.into(),
            namespace: None,
            args: vec!["serve".into()],
            user: None,
            log: "warn",
            inherit_stderr: false,
            envs: Vec::new(),
        }
    }

    /// Runs it as user (and group) `uid`, with no supplementary groups (`setpriv`).
    pub fn as_user(mut self, uid: u32) -> Self {
        self.user = Some(uid);
        self
    }

    /// Runs it inside network namespace `name` (as `ip netns exec name`).
    pub fn in_namespace(mut self, name: &str) -> Self {
        self.namespace = Some(name.to_string());
        self
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// `--portal P` for each.
    pub fn portals<S: ToString>(mut self, portals: &[S]) -> Self {
        for p in portals {
            self.args.push("--portal".into());
            self.args.push(p.to_string().into());
        }
        self
    }

    /// `--lun DIR/file,size=SIZE --data-dir DIR/data`: the usual test disk.
    pub fn disk(self, dir: &Path, file: &str, size: &str) -> Self {
        let lun = format!("{},size={size}", dir.join(file).display());
        self.args(["--lun", &lun])
            .arg("--data-dir")
            .arg(dir.join("data"))
    }

    /// The child's stderr goes to the test's (default: discarded).
    pub fn inherit_stderr(mut self) -> Self {
        self.inherit_stderr = true;
        self
    }

    /// An environment variable for the child (e.g. NOTIFY_SOCKET).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// RUST_LOG for the child (default `warn`).
    pub fn log_level(mut self, level: &'static str) -> Self {
        self.log = level;
        self
    }

    /// Starts it and waits for the whole banner.
    pub fn start(self) -> ServeChild {
        let mut program: Vec<OsString> = Vec::new();
        if let Some(ns) = &self.namespace {
            program.extend(["ip", "netns", "exec", ns.as_str()].map(OsString::from));
        }
        if let Some(uid) = self.user {
            program.push("setpriv".into());
            program.push(format!("--reuid={uid}").into());
            program.push(format!("--regid={uid}").into());
            program.push("--clear-groups".into());
            program.push("--".into());
        }
        program.push(self.bin.clone());
        let mut cmd = Command::new(&program[0]);
        cmd.args(&program[1..])
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", self.log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if self.inherit_stderr {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        let mut child = cmd.spawn().expect("spawn lanes serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        // Reads the banner, then keeps draining stdout so the child never blocks on it.
        std::thread::spawn(move || {
            let mut banner = String::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                banner.push_str(&line);
                banner.push('\n');
                if line.starts_with(LAST_LINE) {
                    let _ = tx.send(banner.clone());
                }
            }
        });
        let banner = match rx.recv_timeout(READY_TIMEOUT) {
            Ok(banner) => banner,
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!("lanes serve printed no banner within {READY_TIMEOUT:?} ({status:?})");
            }
        };
        let (portals, target, wwids) = parse_banner(&banner);
        let Some(&portal) = portals.first() else {
            panic!("no portal in the banner:\n{banner}");
        };
        ServeChild {
            child,
            portal,
            portals,
            target: target.unwrap_or_else(|| panic!("no target in the banner:\n{banner}")),
            wwids,
            banner,
        }
    }
}

/// (portals, first target, WWIDs) from a banner's `portal`, `Target` and `LUN` lines.
pub fn parse_banner(banner: &str) -> (Vec<SocketAddr>, Option<String>, Vec<String>) {
    let (mut portals, mut target, mut wwids) = (Vec::new(), None, Vec::new());
    for line in banner.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Target", name] if target.is_none() => target = Some(name.to_string()),
            ["portal", addr, "TPGT", _, ..] => portals.extend(addr.parse::<SocketAddr>().ok()),
            ["LUN", ..] => {
                let at = words.iter().position(|w| *w == "WWID");
                wwids.extend(at.and_then(|i| words.get(i + 1)).map(|w| w.to_string()));
            }
            _ => {}
        }
    }
    (portals, target, wwids)
}

impl ServeChild {
    /// The first LUN's WWID.
    pub fn wwid(&self) -> &str {
        &self.wwids[0]
    }

    /// Sends `signal` (SIGSTOP and SIGCONT pause and resume the process).
    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = Pid::from_raw(self.child.id() as i32) {
            let _ = kill_process(pid, signal);
        }
    }

    /// SIGSTOP, returning once every thread of the process is stopped. The kernel delivers
    /// the stop to each thread as that thread next runs, so right after `kill` returns a
    /// thread that was already running (a Ceph messenger answering a notify, a socket
    /// writer) may still do a little work; a test that pauses a node to see what happens
    /// without it must wait for this.
    pub fn pause(&self) {
        self.signal(Signal::Stop);
        let pid = self.child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !all_threads_stopped(pid) {
            assert!(
                Instant::now() < deadline,
                "process {pid} not stopped after 10 s"
            );
            // Polling a state the kernel offers no notification for; each round checks it.
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal(Signal::Cont);
    }

    /// Sends `signal` and waits up to `timeout` for the exit.
    pub fn stop(&mut self, signal: Signal, timeout: Duration) -> Option<ExitStatus> {
        if let Some(pid) = Pid::from_raw(self.child.id() as i32) {
            let _ = kill_process(pid, signal);
        }
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if start.elapsed() > timeout {
                return None;
            }
            // Polling the exit with a bound; each round checks it.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether every thread of `pid` is in the stopped state (`T`, or `t` under a tracer). A
/// process that has exited counts as stopped: it does nothing any more.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.filter_map(Result::ok).all(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|stat| {
                let (_, rest) = stat.rsplit_once(") ")?;
                Some(rest.starts_with('T') || rest.starts_with('t'))
            })
            // A thread that ended between the listing and the read.
            .unwrap_or(true)
    })
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn banner_lines_are_read_back() {
        let banner = "lanes serve is ready.\n\nTarget iqn.2026-11.io.lanes:x\n  portal  127.0.0.1:3260   TPGT 1\n  portal  [::1]:3260   TPGT 1\n  LUN 0        1 GiB  512-byte blocks  WWID 3600abc  /d/disk0.img\n";
        let (portals, target, wwids) = super::parse_banner(banner);
        assert_eq!(portals.len(), 2);
        assert_eq!(target.as_deref(), Some("iqn.2026-11.io.lanes:x"));
        assert_eq!(wwids, vec!["3600abc".to_string()]);
    }
}
