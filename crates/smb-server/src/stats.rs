//! What `lanes status` and `/metrics` show of SMB: every connection with its own counters (a
//! channel is a connection bound to a session), the sessions with their channels, like a NAS's
//! `cifs session show` / `cifs connection show`, and server-wide counters named after the
//! multichannel counters such NASes keep (session binds attempted, granted and denied).
//!
//! Counters are atomics bumped on the connection's own task; a snapshot reads them without
//! stopping anything.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use smb_proto::crypto::{Cipher, SigningAlgorithm};

use crate::state::Server;

/// One TCP connection's counters, shared by its reader and writer and listed by the server.
#[derive(Debug)]
pub struct ConnStats {
    /// A server-wide connection id (like ONTAP's connection-id).
    pub id: u64,
    pub client: SocketAddr,
    pub server: SocketAddr,
    /// When it was accepted, in seconds since the Unix epoch.
    pub since: u64,
    /// The negotiated dialect, 0 before NEGOTIATE.
    pub dialect: AtomicU16,
    /// Bytes of direct-TCP frames in and out, their 4-byte prefix included.
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    /// SMB2 requests received (each element of a compound counts).
    pub requests: AtomicU64,
    /// Credits granted to the client and not yet used.
    pub credits: AtomicU64,
    /// An encrypted (transform) frame has arrived.
    pub encrypted: AtomicBool,
}

impl ConnStats {
    pub fn new(id: u64, client: SocketAddr, server: SocketAddr) -> ConnStats {
        ConnStats {
            id,
            client,
            server,
            since: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            dialect: AtomicU16::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            credits: AtomicU64::new(0),
            encrypted: AtomicBool::new(false),
        }
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn view(&self) -> ConnectionView {
        ConnectionView {
            id: self.id,
            client: self.client.to_string(),
            server: self.server.to_string(),
            since: self.since,
            dialect: dialect_name(self.dialect.load(Ordering::Relaxed)),
            encrypted: self.encrypted.load(Ordering::Relaxed),
            credits: self.credits.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
        }
    }
}

/// Server-wide counters (totals since start).
#[derive(Debug, Default)]
pub struct Counters {
    /// TCP connections accepted.
    pub connections: AtomicU64,
    /// Sessions established (first channels).
    pub sessions: AtomicU64,
    /// SESSION_SETUPs that failed authentication (a wrong password, an unknown user).
    pub logon_failures: AtomicU64,
    /// Binding exchanges begun (a SESSION_SETUP with the binding flag).
    pub bind_attempts: AtomicU64,
    /// Channels bound to an existing session.
    pub binds: AtomicU64,
    /// Binding exchanges refused (MS-SMB2 3.3.5.5.2's checks, a wrong key or user, too many
    /// channels).
    pub binds_denied: AtomicU64,
    /// Channels whose connection ended while their session lived on through another.
    pub channels_lost: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The connections the server has open, by connection id.
#[derive(Debug, Default)]
pub struct ConnTable {
    open: Mutex<HashMap<u64, Arc<ConnStats>>>,
}

impl ConnTable {
    pub fn insert(&self, c: Arc<ConnStats>) {
        self.open.lock().insert(c.id, c);
    }
    pub fn remove(&self, id: u64) {
        self.open.lock().remove(&id);
    }
    pub fn len(&self) -> usize {
        self.open.lock().len()
    }
    pub fn is_empty(&self) -> bool {
        self.open.lock().is_empty()
    }
    fn snapshot(&self) -> Vec<Arc<ConnStats>> {
        let mut all: Vec<_> = self.open.lock().values().cloned().collect();
        all.sort_by_key(|c| c.id);
        all
    }
}

#[derive(Debug, Serialize)]
pub struct ConnectionView {
    pub id: u64,
    pub client: String,
    pub server: String,
    pub since: u64,
    pub dialect: &'static str,
    pub encrypted: bool,
    pub credits: u64,
    pub requests: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

#[derive(Debug, Serialize)]
pub struct SessionView {
    /// The SessionId as clients and packet traces show it.
    pub id: String,
    pub user: String,
    pub client_guid: String,
    pub dialect: &'static str,
    pub signing: &'static str,
    pub signing_required: bool,
    /// The negotiated cipher ("-" without one); a channel's `encrypted` tells whether the
    /// client uses it.
    pub cipher: &'static str,
    pub trees: usize,
    pub opens: usize,
    /// Channels bound after the first, and channels lost, over the session's life.
    pub binds: u64,
    pub channels_lost: u64,
    pub channels: Vec<ConnectionView>,
}

#[derive(Debug, Serialize)]
pub struct CountersView {
    pub connections: u64,
    pub sessions: u64,
    pub logon_failures: u64,
    pub bind_attempts: u64,
    pub binds: u64,
    pub binds_denied: u64,
    pub channels_lost: u64,
}

/// The SMB part of a `lanes status` reply.
#[derive(Debug, Serialize)]
pub struct StatusView {
    pub listen: Vec<String>,
    pub sessions: Vec<SessionView>,
    /// Every open connection, channels of a session or not (yet).
    pub connections: Vec<ConnectionView>,
    pub counters: CountersView,
}

/// "3.1.1", "3.0.2", "3.0", "2.1", "2.0.2"; "-" before NEGOTIATE.
pub fn dialect_name(d: u16) -> &'static str {
    smb_proto::server::dialect::name_of(d)
}

pub fn signing_name(s: SigningAlgorithm) -> &'static str {
    match s {
        SigningAlgorithm::AesCmac => "AES-128-CMAC",
        SigningAlgorithm::AesGmac => "AES-128-GMAC",
        SigningAlgorithm::HmacSha256 => "HMAC-SHA256",
    }
}

pub fn cipher_name(c: Option<Cipher>) -> &'static str {
    match c {
        None => "-",
        Some(Cipher::Aes128Ccm) => "AES-128-CCM",
        Some(Cipher::Aes128Gcm) => "AES-128-GCM",
        Some(Cipher::Aes256Ccm) => "AES-256-CCM",
        Some(Cipher::Aes256Gcm) => "AES-256-GCM",
    }
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Server {
    /// Sessions with their channels, every connection, and the counters.
    pub fn status(&self) -> StatusView {
        let mut sessions: Vec<SessionView> = self
            .sessions_snapshot()
            .iter()
            .map(|s| {
                let st = s.state.lock();
                let mut channels: Vec<ConnectionView> =
                    st.channel_stats.iter().map(|c| c.view()).collect();
                channels.sort_by_key(|c| c.id);
                SessionView {
                    id: format!("{:#018x}", s.id),
                    user: s.user.clone(),
                    client_guid: hex(&s.client_guid),
                    dialect: dialect_name(s.dialect),
                    signing: signing_name(s.signing),
                    signing_required: s.signing_required,
                    cipher: cipher_name(s.cipher),
                    trees: st.trees.len(),
                    opens: st.opens.len(),
                    binds: s.binds.load(Ordering::Relaxed),
                    channels_lost: s.channels_lost.load(Ordering::Relaxed),
                    channels,
                }
            })
            .collect();
        sessions.sort_by(|a, b| a.id.cmp(&b.id));
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatusView {
            listen: self.config.listen.iter().map(ToString::to_string).collect(),
            sessions,
            connections: self.conns.snapshot().iter().map(|c| c.view()).collect(),
            counters: CountersView {
                connections: load(&c.connections),
                sessions: load(&c.sessions),
                logon_failures: load(&c.logon_failures),
                bind_attempts: load(&c.bind_attempts),
                binds: load(&c.binds),
                binds_denied: load(&c.binds_denied),
                channels_lost: load(&c.channels_lost),
            },
        }
    }

    /// The same figures in Prometheus' text format.
    pub fn write_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let view = self.status();
        let channels: usize = view.sessions.iter().map(|s| s.channels.len()).sum();
        for (name, help, v) in [
            (
                "sessions",
                "SMB sessions established now",
                view.sessions.len(),
            ),
            ("channels", "Channels of the SMB sessions now", channels),
            (
                "connections",
                "SMB connections open now",
                view.connections.len(),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP lanes_smb_{name} {help}.\n# TYPE lanes_smb_{name} gauge\nlanes_smb_{name} {v}"
            );
        }
        let c = &view.counters;
        for (name, help, v) in [
            (
                "connections_accepted",
                "SMB connections accepted",
                c.connections,
            ),
            (
                "sessions_established",
                "SMB sessions established",
                c.sessions,
            ),
            (
                "logon_failures",
                "SMB authentications that failed",
                c.logon_failures,
            ),
            (
                "session_bind_attempts",
                "SMB multichannel session binds attempted",
                c.bind_attempts,
            ),
            (
                "session_bind_ops",
                "SMB multichannel session binds",
                c.binds,
            ),
            (
                "session_bind_denied",
                "SMB multichannel session binds refused",
                c.binds_denied,
            ),
            (
                "channels_lost",
                "SMB channels lost while their session lived on",
                c.channels_lost,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP lanes_smb_{name}_total {help}.\n# TYPE lanes_smb_{name}_total counter\nlanes_smb_{name}_total {v}"
            );
        }
        for (name, help) in [
            ("requests", "SMB2 requests received on the channel"),
            ("bytes_in", "Bytes received on the channel"),
            ("bytes_out", "Bytes sent on the channel"),
        ] {
            let _ = writeln!(
                out,
                "# HELP lanes_smb_channel_{name}_total {help}.\n# TYPE lanes_smb_channel_{name}_total counter"
            );
            for s in &view.sessions {
                for ch in &s.channels {
                    let v = match name {
                        "requests" => ch.requests,
                        "bytes_in" => ch.bytes_in,
                        _ => ch.bytes_out,
                    };
                    let _ = writeln!(
                        out,
                        "lanes_smb_channel_{name}_total{{session=\"{}\",user=\"{}\",connection=\"{}\",client=\"{}\",server=\"{}\"}} {v}",
                        s.id, label(&s.user), ch.id, ch.client, ch.server
                    );
                }
            }
        }
    }
}
