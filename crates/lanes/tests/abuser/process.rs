//! The abuser in a child process of its own session. On a shared machine the scheduler
//! divides CPU time between sessions (autogroups) first: in its own session the abuser gets
//! a share of its own, like a machine of its own would, instead of taking its CPU time from
//! the share of the measured session and the server. The child is this test binary, run as
//! the ignored test `abuser_process` with the `LANES_ABUSE_*` environment set.

use super::{Abuser, HoldReport, Stats};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const PREFIX: &str = "ABUSER";

/// Messages from the child, in order.
enum Message {
    Report(HoldReport),
    Stats(Stats),
}

/// The parent's handle on the abuser process.
pub struct AbuserProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    messages: mpsc::Receiver<Message>,
    /// Set once the population of the hold under way is open; cleared by `hold`.
    opened: Arc<AtomicBool>,
}

impl Drop for AbuserProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl AbuserProcess {
    /// Starts the child: `idle` + `slow` connections to `portal`, RSS of `pid` sampled.
    pub fn start(portal: SocketAddr, pid: u32, idle: usize, slow: usize) -> AbuserProcess {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["abuser_process", "--exact", "--ignored", "--nocapture"])
            .env("LANES_ABUSE_PORTAL", portal.to_string())
            .env("LANES_ABUSE_PID", pid.to_string())
            .env("LANES_ABUSE_IDLE", idle.to_string())
            .env("LANES_ABUSE_SLOW", slow.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the abuser process");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, messages) = mpsc::channel();
        let opened = Arc::new(AtomicBool::new(false));
        let set_opened = opened.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let words: Vec<&str> = line.split_whitespace().collect();
                let n = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
                let message = match words.as_slice() {
                    [PREFIX, "opened", ..] => {
                        set_opened.store(true, Ordering::SeqCst);
                        continue;
                    }
                    [PREFIX, "report", ..] => Message::Report(HoldReport {
                        still_open: n(2).unwrap_or(u64::MAX) as usize,
                        opening: Duration::from_micros(n(3).unwrap_or(u64::MAX)),
                        lifetimes: words
                            .get(4)
                            .map(|w| {
                                w.split(',')
                                    .filter_map(|v| v.parse().ok())
                                    .map(Duration::from_micros)
                                    .collect()
                            })
                            .unwrap_or_default(),
                    }),
                    [PREFIX, "stats", ..] => Message::Stats(Stats {
                        opened: n(2).unwrap_or(0),
                        dropped: n(3).unwrap_or(0),
                        max_rss_kib: n(4).unwrap_or(u64::MAX),
                    }),
                    _ => continue,
                };
                if tx.send(message).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        AbuserProcess {
            child,
            stdin,
            messages,
            opened,
        }
    }

    /// Opens the population afresh and holds it until the server has dropped it all (at most
    /// `within`); collect the outcome with `report`.
    pub fn hold(&mut self, within: Duration) {
        self.opened.store(false, Ordering::SeqCst);
        let stdin = self.stdin.as_mut().expect("abuser running");
        writeln!(stdin, "hold {}", micros(within)).expect("command the abuser");
        stdin.flush().expect("command the abuser");
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Set once the population of the hold under way is open.
    pub fn opened(&self) -> Arc<AtomicBool> {
        self.opened.clone()
    }

    pub fn report(&self, within: Duration) -> HoldReport {
        match self.messages.recv_timeout(within) {
            Ok(Message::Report(r)) => r,
            Ok(Message::Stats(_)) => panic!("stats before the report"),
            Err(e) => panic!("no report from the abuser: {e}"),
        }
    }

    pub fn stop(mut self) -> Stats {
        drop(self.stdin.take());
        match self.messages.recv_timeout(Duration::from_secs(30)) {
            Ok(Message::Stats(s)) => s,
            _ => panic!("no stats from the abuser"),
        }
    }
}

/// The child's side: runs when the `LANES_ABUSE_*` environment is set, else returns.
pub fn child_main() {
    let var = |name: &str| std::env::var(name).ok();
    let (Some(portal), Some(pid), Some(idle), Some(slow)) = (
        var("LANES_ABUSE_PORTAL").and_then(|v| v.parse::<SocketAddr>().ok()),
        var("LANES_ABUSE_PID").and_then(|v| v.parse::<u32>().ok()),
        var("LANES_ABUSE_IDLE").and_then(|v| v.parse::<usize>().ok()),
        var("LANES_ABUSE_SLOW").and_then(|v| v.parse::<usize>().ok()),
    ) else {
        return;
    };
    // A session of its own, hence a scheduling autogroup of its own.
    let _ = rustix::process::setsid();
    let abuser = Abuser::start(portal, pid, idle, slow);
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        let Some(within) = line
            .strip_prefix("hold ")
            .and_then(|v| v.trim().parse::<u64>().ok())
        else {
            continue;
        };
        let holding = abuser.hold(Duration::from_micros(within));
        if let Ok(opening) = holding.opened.recv() {
            let _ = writeln!(out, "{PREFIX} opened {}", micros(opening));
            let _ = out.flush();
        }
        let report = holding.report.recv().expect("hold report");
        let lifetimes: Vec<String> = report
            .lifetimes
            .iter()
            .map(|d| micros(*d).to_string())
            .collect();
        let _ = writeln!(
            out,
            "{PREFIX} report {} {} {}",
            report.still_open,
            micros(report.opening),
            lifetimes.join(",")
        );
        let _ = out.flush();
    }
    let stats = abuser.stop();
    let _ = writeln!(
        out,
        "{PREFIX} stats {} {} {}",
        stats.opened, stats.dropped, stats.max_rss_kib
    );
    let _ = out.flush();
}
