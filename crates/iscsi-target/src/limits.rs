//! Limits under abuse: admission of accepted connections (per portal and in total), and the
//! per-source log limiter, so that a flood of limit hits costs one warning per source address
//! and limit per interval instead of one per connection.
//!
//! Nothing here is on the I/O path: connection counters are atomics touched once per accept
//! and once per close, and the log limiter's lock is taken only when a limit is hit.

use crate::config::LimitsConfig;
use crate::server::SessionTable;
use iscsi_proto::login::{LoginRefusal, LoginStep};
use iscsi_proto::pdu::{LoginRequest, LoginResponse};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpSocket};
use tracing::warn;

/// Sources the log limiter remembers; hits from further sources are only counted.
const MAX_TRACKED_SOURCES: usize = 4096;

/// Which bound a peer ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// `connections`: the server holds its most connections.
    Connections,
    /// `connections-per-portal`: the listening address holds its most connections.
    PortalConnections,
    /// `login-timeout`: no full-feature phase in time.
    LoginTimeout,
    /// `sessions-per-initiator`.
    Sessions,
    /// `text-rounds`: a text exchange went on too long.
    TextRounds,
    /// `text-keys` / `text-bytes`: too much key text in one request.
    TextSize,
    /// A login the target refused (bad name, ACL, CHAP, protocol error).
    LoginRefused,
    /// Immediate commands beyond `commands-per-session` outside the window.
    ImmediateCommands,
}

impl Limit {
    /// Every limit, in the order of `LimitLog`'s counters.
    pub const ALL: [Limit; 8] = [
        Limit::Connections,
        Limit::PortalConnections,
        Limit::LoginTimeout,
        Limit::Sessions,
        Limit::TextRounds,
        Limit::TextSize,
        Limit::LoginRefused,
        Limit::ImmediateCommands,
    ];

    fn index(self) -> usize {
        Limit::ALL.iter().position(|l| *l == self).unwrap_or(0)
    }

    /// The name used in log lines: the configuration key, where there is one.
    pub fn name(self) -> &'static str {
        match self {
            Limit::Connections => "connections",
            Limit::PortalConnections => "connections-per-portal",
            Limit::LoginTimeout => "login-timeout",
            Limit::Sessions => "sessions-per-initiator",
            Limit::TextRounds => "text-rounds",
            Limit::TextSize => "text-keys",
            Limit::LoginRefused => "login-refused",
            Limit::ImmediateCommands => "immediate-commands",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the server knows about its limits at run time.
pub struct Limits {
    pub config: LimitsConfig,
    connections: Arc<AtomicUsize>,
    pub log: LimitLog,
}

/// A connection counted against the total and its portal's count until dropped.
pub struct ConnectionSlot {
    total: Arc<AtomicUsize>,
    portal: Arc<AtomicUsize>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.total.fetch_sub(1, Ordering::AcqRel);
        self.portal.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Limits {
    pub fn new(config: LimitsConfig) -> Self {
        let log = LimitLog::new(config.log_interval);
        Limits {
            config,
            connections: Arc::new(AtomicUsize::new(0)),
            log,
        }
    }

    /// Counts a just-accepted connection from `peer` on a portal whose open connections are
    /// `portal`; `None` (and one log line per source and interval) if that would exceed a
    /// limit: the caller closes the socket at once.
    pub fn admit(&self, portal: &Arc<AtomicUsize>, peer: IpAddr) -> Option<ConnectionSlot> {
        let total = self.connections.fetch_add(1, Ordering::AcqRel);
        let on_portal = portal.fetch_add(1, Ordering::AcqRel);
        let slot = ConnectionSlot {
            total: self.connections.clone(),
            portal: portal.clone(),
        };
        if total >= self.config.connections {
            self.log.hit(peer, Limit::Connections, || {
                format!(
                    "{} connections open; closing new ones",
                    self.config.connections
                )
            });
            return None;
        }
        if on_portal >= self.config.connections_per_portal {
            self.log.hit(peer, Limit::PortalConnections, || {
                format!(
                    "{} connections open on this portal; closing new ones",
                    self.config.connections_per_portal
                )
            });
            return None;
        }
        Some(slot)
    }

    /// Connections currently open (login phase included).
    pub fn open_connections(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }
}

impl Limits {
    /// A connection did not reach the full-feature phase within `login-timeout`.
    pub fn login_timed_out(&self, peer: SocketAddr, portal: SocketAddr) {
        self.log.hit(peer.ip(), Limit::LoginTimeout, || {
            format!(
                "no full-feature phase within {:?} of accept (peer {peer}, portal {portal}); dropped",
                self.config.login_timeout
            )
        });
    }
}

/// `sessions-per-initiator`: refuses a new session of `initiator` when it holds the most
/// already (checked under the session-table lock, at login only). RFC 7143 11.13.5 has no
/// status for this; "out of resources" (0x0302) is the closest.
pub fn check_sessions(
    limits: &Limits,
    table: &SessionTable,
    initiator: &str,
    peer: SocketAddr,
) -> Result<(), LoginRefusal> {
    let max = limits.config.sessions_per_initiator;
    let held = table
        .by_tsih
        .values()
        .filter(|s| &*s.initiator_name == initiator)
        .take(max)
        .count();
    if held < max {
        return Ok(());
    }
    limits.log.hit(peer.ip(), Limit::Sessions, || {
        format!("{initiator} holds {max} sessions; login from {peer} refused")
    });
    Err(LoginRefusal::OutOfResources)
}

/// Immediate SCSI commands take no CmdSN slot (RFC 7143 3.2.2.1), so the window does not bound
/// them: a session may have at most `commands-per-session` tasks beyond its window in flight.
/// One atomic load, and only for immediate commands.
pub fn too_many_immediate(
    limits: &Limits,
    session: &crate::session::Session,
    pdu: &iscsi_proto::pdu::Pdu,
    peer: SocketAddr,
) -> bool {
    if !matches!(pdu, iscsi_proto::pdu::Pdu::ScsiCommand(_)) {
        return false;
    }
    let window = usize::try_from(limits.config.commands_per_session).unwrap_or(usize::MAX);
    if session.tasks_in_flight() < window.saturating_mul(2) {
        return false;
    }
    limits.log.hit(peer.ip(), Limit::ImmediateCommands, || {
        format!(
            "{peer} has {} tasks in flight; immediate command rejected",
            window * 2
        )
    });
    true
}

/// Key text received over one login, checked against `text-keys` and `text-bytes` before the
/// login machine parses it.
#[derive(Debug, Default)]
pub struct LoginText {
    keys: usize,
    bytes: usize,
}

impl LoginText {
    /// Adds `req`'s text; over a limit, the login fails with "initiator error" (RFC 7143
    /// 11.13.5, status 0x0200).
    pub fn check(&mut self, req: &LoginRequest, config: &LimitsConfig) -> Result<(), LoginStep> {
        self.keys = self.keys.saturating_add(count_keys(&req.data));
        self.bytes = self.bytes.saturating_add(req.data.len());
        if self.keys <= config.text_keys && self.bytes <= config.text_bytes {
            return Ok(());
        }
        let refusal = LoginRefusal::InitiatorError;
        let (status_class, status_detail) = refusal.status();
        let response = LoginResponse {
            csg: req.csg,
            isid: req.isid,
            tsih: req.tsih,
            itt: req.itt,
            stat_sn: req.exp_stat_sn,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: req.cmd_sn,
            status_class,
            status_detail,
            ..LoginResponse::default()
        };
        Err(LoginStep::Failed(response, refusal))
    }
}

/// Text Requests of the current full-feature text exchange (`text-rounds`): the requests in a
/// row with one Initiator Task Tag, the C bit pieces and continuation requests included
/// (RFC 7143 11.10.2: every request of one negotiation carries the same ITT).
#[derive(Debug, Default)]
pub struct TextExchange {
    itt: Option<u32>,
    rounds: u32,
}

impl TextExchange {
    /// Counts one Text Request; false once the exchange has taken more than `max_rounds`, after
    /// which it starts over (the caller answers with a Reject "negotiation reset").
    pub fn admit(&mut self, itt: u32, max_rounds: u32) -> bool {
        if self.itt != Some(itt) {
            self.itt = Some(itt);
            self.rounds = 0;
        }
        self.rounds = self.rounds.saturating_add(1);
        if self.rounds > max_rounds {
            self.itt = None;
            return false;
        }
        true
    }
}

/// Key=value pairs in a text segment: its non-empty NUL-terminated runs (RFC 7143 6.1).
pub fn count_keys(text: &[u8]) -> usize {
    text.split(|b| *b == 0)
        .filter(|pair| !pair.is_empty())
        .count()
}

/// Hits of one limit from one source within the current interval.
struct Window {
    started: Instant,
    /// Hits after the one that was logged.
    unreported: u64,
}

/// Logs limit hits once per (source address, limit) and interval, with a count of the rest.
pub struct LimitLog {
    interval: Duration,
    windows: Mutex<HashMap<(IpAddr, Limit), Window>>,
    /// Hits from sources beyond `MAX_TRACKED_SOURCES`, reported by `report`.
    untracked: AtomicU64,
    /// Every hit since start, per limit (`Limit::ALL` order), for status and metrics.
    hits: [AtomicU64; Limit::ALL.len()],
}

impl LimitLog {
    pub fn new(interval: Duration) -> Self {
        LimitLog {
            interval,
            windows: Mutex::new(HashMap::new()),
            untracked: AtomicU64::new(0),
            hits: Default::default(),
        }
    }

    /// Hits of every limit since start.
    pub fn totals(&self) -> impl Iterator<Item = (Limit, u64)> + '_ {
        Limit::ALL
            .iter()
            .zip(&self.hits)
            .map(|(l, n)| (*l, n.load(Ordering::Relaxed)))
    }

    /// Records a hit of `limit` by `source`. The first hit of an interval is logged with
    /// `detail`; the others are counted and reported by `report` when the interval ends.
    /// Returns whether this hit was logged.
    pub fn hit(&self, source: IpAddr, limit: Limit, detail: impl FnOnce() -> String) -> bool {
        if let Some(n) = self.hits.get(limit.index()) {
            n.fetch_add(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        let mut windows = self.windows.lock();
        if let Some(w) = windows.get_mut(&(source, limit)) {
            if now.duration_since(w.started) < self.interval {
                w.unreported += 1;
                return false;
            }
            let unreported = std::mem::take(&mut w.unreported);
            w.started = now;
            drop(windows);
            self.log_first(source, limit, unreported, &detail());
            return true;
        }
        if windows.len() >= MAX_TRACKED_SOURCES {
            let interval = self.interval;
            windows.retain(|_, w| now.duration_since(w.started) < interval || w.unreported > 0);
            if windows.len() >= MAX_TRACKED_SOURCES {
                self.untracked.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
        windows.insert(
            (source, limit),
            Window {
                started: now,
                unreported: 0,
            },
        );
        drop(windows);
        self.log_first(source, limit, 0, &detail());
        true
    }

    fn log_first(&self, source: IpAddr, limit: Limit, earlier: u64, detail: &str) {
        let interval = self.interval;
        if earlier > 0 {
            warn!(%source, %limit, count = earlier, "limit hit {earlier} more times in the last {interval:?}");
        }
        warn!(%source, %limit, "limit hit: {detail} (further hits from this source are counted and reported every {interval:?})");
    }

    /// Reports the hits counted in intervals that have ended and forgets quiet sources; run
    /// every interval by `report_loop`.
    pub fn report(&self) {
        let now = Instant::now();
        let interval = self.interval;
        let mut ended = Vec::new();
        self.windows.lock().retain(|key, w| {
            if now.duration_since(w.started) < interval {
                return true;
            }
            if w.unreported > 0 {
                ended.push((*key, w.unreported));
            }
            false
        });
        for ((source, limit), count) in ended {
            warn!(%source, %limit, count, "limit hit {count} more times in the last {interval:?}");
        }
        let untracked = self.untracked.swap(0, Ordering::Relaxed);
        if untracked > 0 {
            warn!(
                count = untracked,
                "limit hit {untracked} times by sources beyond the {MAX_TRACKED_SOURCES} tracked"
            );
        }
    }
}

/// The Prometheus lines of the limits: open connections and hits per limit.
pub fn write_metrics(limits: &Limits, out: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "# HELP lanes_open_connections Accepted connections, login phase included.\n\
         # TYPE lanes_open_connections gauge\nlanes_open_connections {}",
        limits.open_connections()
    );
    let _ = writeln!(
        out,
        "# HELP lanes_limit_hits_total Connections, logins and requests refused or dropped by a limit.\n\
         # TYPE lanes_limit_hits_total counter"
    );
    for (limit, n) in limits.log.totals() {
        let _ = writeln!(out, "lanes_limit_hits_total{{limit=\"{limit}\"}} {n}");
    }
}

/// Reports counted limit hits every log interval until the server shuts down.
pub async fn report_loop(server: Arc<crate::server::Server>) {
    let period = server.limits.log.interval.min(Duration::from_secs(3600));
    let mut ticker = tokio::time::interval(period / 4);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => server.limits.log.report(),
            _ = server.shutdown.cancelled() => return,
        }
    }
}

/// Most connections a listener queues before they are accepted (the kernel caps it further at
/// `net.core.somaxconn`).
const MAX_BACKLOG: u32 = 4096;

/// Binds a portal's listener with an accept queue sized for `connections-per-portal`: under a
/// flood of connects, a short queue makes the kernel drop handshakes, which then complete
/// seconds later with SYN-ACK retransmits, well after the peer believes it is connected.
pub fn listen(addr: std::net::SocketAddr, config: &LimitsConfig) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let backlog = u32::try_from(config.connections_per_portal)
        .unwrap_or(MAX_BACKLOG)
        .clamp(1024, MAX_BACKLOG);
    socket.listen(backlog)
}

/// File descriptors kept free of connections: listeners, LUN files, the status socket, logs.
const SPARE_FILES: u64 = 64;

/// Raises the soft open-files limit towards the hard one so that `connections` sockets fit,
/// and warns when they still do not (accepts would then fail with EMFILE first).
pub fn raise_open_files_limit(connections: usize) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let want = u64::try_from(connections)
        .unwrap_or(u64::MAX)
        .saturating_add(SPARE_FILES);
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let mut soft = soft;
    if soft < want {
        let raised = want.min(hard);
        if setrlimit(Resource::RLIMIT_NOFILE, raised, hard).is_ok() {
            soft = raised;
        }
    }
    if soft < want {
        warn!(
            "the open-files limit ({soft}) is below limits.connections ({connections}) + {SPARE_FILES}; \
             raise it (ulimit -n) or lower limits.connections"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_source_and_interval() {
        let log = LimitLog::new(Duration::from_secs(3600));
        let a: IpAddr = [127, 0, 0, 1].into();
        let b: IpAddr = [127, 0, 0, 2].into();
        let logged = (0..1000)
            .filter(|_| log.hit(a, Limit::LoginTimeout, String::new))
            .count();
        assert_eq!(logged, 1);
        assert!(log.hit(b, Limit::LoginTimeout, String::new));
        assert!(log.hit(a, Limit::Connections, String::new));
        let w = log.windows.lock();
        assert_eq!(w[&(a, Limit::LoginTimeout)].unreported, 999);
        drop(w);
        let totals: Vec<_> = log.totals().filter(|(_, n)| *n > 0).collect();
        assert_eq!(
            totals,
            vec![(Limit::Connections, 1), (Limit::LoginTimeout, 1001)]
        );
    }

    #[test]
    fn ended_interval_logs_again() {
        let log = LimitLog::new(Duration::from_millis(1));
        let a: IpAddr = [127, 0, 0, 1].into();
        assert!(log.hit(a, Limit::LoginTimeout, String::new));
        std::thread::sleep(Duration::from_millis(5));
        assert!(log.hit(a, Limit::LoginTimeout, String::new));
        std::thread::sleep(Duration::from_millis(5));
        log.report();
        assert!(log.windows.lock().is_empty());
    }

    #[test]
    fn admission_counts_and_releases() {
        let limits = Limits::new(LimitsConfig {
            connections: 3,
            connections_per_portal: 2,
            ..LimitsConfig::default()
        });
        let ip: IpAddr = [127, 0, 0, 1].into();
        let p1 = Arc::new(AtomicUsize::new(0));
        let p2 = Arc::new(AtomicUsize::new(0));
        let a = limits.admit(&p1, ip).expect("first");
        let _b = limits.admit(&p1, ip).expect("second");
        assert!(limits.admit(&p1, ip).is_none(), "portal full");
        let _c = limits.admit(&p2, ip).expect("other portal");
        assert!(limits.admit(&p2, ip).is_none(), "total full");
        drop(a);
        assert_eq!(limits.open_connections(), 2);
        let _d = limits.admit(&p1, ip).expect("room again");
        assert_eq!(p1.load(Ordering::Acquire), 2);
    }
}
