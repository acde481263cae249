//! The abusive peers of `abuse.rs`: a thread that opens idle connections and one-byte-a-second
//! logins against a portal, holds them until the server drops them (watching all with one
//! `poll` per tick), and samples the server's RSS meanwhile; `process` runs it in a child
//! process of its own session.

pub mod process;

use rustix::event::{poll, PollFd, PollFlags};
use std::io::{ErrorKind, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often connections are checked and slow bytes sent.
const TICK: Duration = Duration::from_millis(100);

/// What a hold ended with: how long each connection lived until the server dropped it.
pub struct HoldReport {
    pub lifetimes: Vec<Duration>,
    pub still_open: usize,
    /// From the hold command to the last connection open.
    pub opening: Duration,
}

/// Totals over the abuser's life.
pub struct Stats {
    pub opened: u64,
    pub dropped: u64,
    pub max_rss_kib: u64,
}

enum Mode {
    Off,
    /// The population was opened once; report when the server has dropped all of it, or at
    /// the deadline.
    Hold {
        deadline: Instant,
        lifetimes: Vec<Duration>,
        report: mpsc::Sender<HoldReport>,
        opening: Duration,
    },
}

/// Open the population and hold it for at most this long.
/// Hold for at most this long; tell the first sender when the population is open, the
/// second the outcome.
struct Command(Duration, mpsc::Sender<Duration>, mpsc::Sender<HoldReport>);

/// A hold under way: when the population is open (how long opening it took), then the outcome.
pub struct Holding {
    pub opened: mpsc::Receiver<Duration>,
    pub report: mpsc::Receiver<HoldReport>,
}

struct Peer {
    stream: TcpStream,
    slow: bool,
    opened: Instant,
    next_byte: Instant,
    sent: usize,
}

pub struct Abuser {
    commands: mpsc::Sender<Command>,
    thread: JoinHandle<Stats>,
}

/// VmRSS of process `pid` in KiB (0 if unreadable).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

/// The bytes a slow peer sends one per second: a valid Login Request, so it looks like a
/// login until the end.
fn login_bytes() -> Vec<u8> {
    use iscsi_proto::pdu::{Framer, LoginRequest, Pdu};
    Framer::default().encode_to_vec(&Pdu::LoginRequest(LoginRequest {
        transit: true,
        nsg: 1,
        isid: [0x80, 0, 0, 0, 0, 7],
        itt: 1,
        cid: 1,
        cmd_sn: 1,
        data: iscsi_proto::text::encode(&[
            ("InitiatorName", "iqn.2026-11.io.lanes:slow"),
            ("SessionType", "Discovery"),
            ("AuthMethod", "None"),
        ]),
        ..LoginRequest::default()
    }))
}

impl Abuser {
    /// Starts the thread (idle until `hold`); samples `pid`'s RSS every tick.
    pub fn start(portal: SocketAddr, pid: u32, idle: usize, slow: usize) -> Abuser {
        let (commands, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || run(portal, pid, idle, slow, rx));
        Abuser { commands, thread }
    }

    /// Opens the population afresh and holds it until the server has dropped all of it (at
    /// most `within`).
    pub fn hold(&self, within: Duration) -> Holding {
        let (opened_tx, opened) = mpsc::channel();
        let (report_tx, report) = mpsc::channel();
        self.commands
            .send(Command(within, opened_tx, report_tx))
            .expect("abuser alive");
        Holding { opened, report }
    }

    pub fn stop(self) -> Stats {
        drop(self.commands);
        self.thread.join().expect("abuser thread")
    }
}

fn run(
    portal: SocketAddr,
    pid: u32,
    idle: usize,
    slow: usize,
    commands: mpsc::Receiver<Command>,
) -> Stats {
    let bytes = login_bytes();
    let mut stats = Stats {
        opened: 0,
        dropped: 0,
        max_rss_kib: 0,
    };
    let mut peers: Vec<Peer> = Vec::new();
    let mut mode = Mode::Off;
    loop {
        match commands.recv_timeout(TICK) {
            Ok(Command(within, opened, report)) => {
                peers.clear();
                let started = Instant::now();
                open(portal, idle, slow, &mut peers, &mut stats);
                let opening = started.elapsed();
                let _ = opened.send(opening);
                mode = Mode::Hold {
                    deadline: Instant::now() + within,
                    lifetimes: Vec::new(),
                    report,
                    opening,
                };
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return stats,
        }
        stats.max_rss_kib = stats.max_rss_kib.max(rss_kib(pid));
        let now = Instant::now();
        for p in peers.iter_mut().filter(|p| p.slow && p.next_byte <= now) {
            let b = bytes.get(p.sent % bytes.len()).copied().unwrap_or(0);
            // A failed write means the server is gone; `poll` below sees it.
            let _ = p.stream.write(&[b]);
            p.sent += 1;
            p.next_byte = now + Duration::from_secs(1);
        }
        for i in dropped(&peers).into_iter().rev() {
            let p = peers.swap_remove(i);
            stats.dropped += 1;
            if let Mode::Hold { lifetimes, .. } = &mut mode {
                lifetimes.push(p.opened.elapsed());
            }
        }
        match &mode {
            Mode::Hold { deadline, .. } if peers.is_empty() || Instant::now() >= *deadline => {
                if let Mode::Hold {
                    lifetimes,
                    report,
                    opening,
                    ..
                } = std::mem::replace(&mut mode, Mode::Off)
                {
                    let _ = report.send(HoldReport {
                        lifetimes,
                        still_open: peers.len(),
                        opening,
                    });
                }
                peers.clear();
            }
            _ => {}
        }
    }
}

/// Indices of the peers the server has closed (readable EOF, hang-up or error), ascending.
fn dropped(peers: &[Peer]) -> Vec<usize> {
    let mut fds: Vec<PollFd<'_>> = peers
        .iter()
        .map(|p| PollFd::new(&p.stream, PollFlags::IN | PollFlags::RDHUP))
        .collect();
    if fds.is_empty() || poll(&mut fds, 0).unwrap_or(0) == 0 {
        return Vec::new();
    }
    fds.iter()
        .enumerate()
        .filter(|(_, fd)| !fd.revents().is_empty())
        .map(|(i, _)| i)
        .collect()
}

/// Opens `idle` idle and `slow` slow connections, interleaved.
fn open(portal: SocketAddr, idle: usize, slow: usize, peers: &mut Vec<Peer>, stats: &mut Stats) {
    let every = (idle + slow) / slow.max(1);
    for i in 0..idle + slow {
        let slow = i % every == 0 && i / every < slow;
        // Taken before connecting: the server cannot have accepted the connection, and started
        // its login timer, any earlier.
        let opened = Instant::now();
        let stream = match TcpStream::connect_timeout(&portal, Duration::from_secs(5)) {
            Ok(s) => s,
            Err(e) if e.kind() == ErrorKind::TimedOut => continue,
            Err(e) => panic!("abusive connect to {portal}: {e}"),
        };
        let _ = stream.set_nonblocking(true);
        stats.opened += 1;
        peers.push(Peer {
            stream,
            slow,
            opened,
            next_byte: opened,
            sent: 0,
        });
    }
}

/// CPU time (user + system, all threads) process `pid` has used, in clock ticks (0 if
/// unreadable).
pub fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command name (which may hold spaces): state is field 3, utime 14.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse().ok())
        .collect();
    fields.iter().sum()
}

/// The machine's busy and total CPU time, in clock ticks, from `/proc/stat`.
pub fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    // idle and iowait
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}
