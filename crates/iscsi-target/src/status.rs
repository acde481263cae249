//! Observability and control: the status unix socket (one JSON request line, one JSON reply:
//! `status`, `alua`, `reload`, `config`) and the Prometheus `/metrics` endpoint, both reading
//! the live counters.

use crate::server::Server;
use crate::Error;
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener};
use tracing::{info, warn};

/// Another service of the same process (the SMB server) that reports through the status socket
/// and the `/metrics` endpoint.
pub trait StatusSection: Send + Sync {
    /// Its key in the `status` reply.
    fn key(&self) -> &'static str;
    /// Its part of the `status` reply.
    fn status(&self) -> serde_json::Value;
    /// Appends its Prometheus text.
    fn metrics(&self, out: &mut String);
}

#[derive(Serialize)]
struct ConnectionView {
    cid: u16,
    portal: String,
    peer: String,
    header_digest: &'static str,
    data_digest: &'static str,
    commands: u64,
    bytes_in: u64,
    bytes_out: u64,
    pdus_in: u64,
    pdus_out: u64,
    /// Vectored socket writes that sent `pdus_out` (PDUs per write: how well responses batch).
    writes_out: u64,
}

#[derive(Serialize)]
struct SessionView {
    id: u64,
    initiator: String,
    isid: String,
    tsih: u16,
    target: String,
    tpgt: u16,
    connections: Vec<ConnectionView>,
}

/// One replicated LUN of an HA pair (`[cluster]`).
#[derive(Serialize)]
struct PairView {
    target: String,
    lun: u64,
    /// This node, 1 or 2.
    node: u8,
    /// The replica's state: Paired, Alone, Suspended, Outdated, ResyncSource, ResyncTarget.
    role: &'static str,
    epoch: u64,
    peer_connected: bool,
    alua: &'static str,
    resync_remaining: u64,
    dirty_regions: u64,
    /// Blocks whose data this node sent as sync source.
    resync_blocks: u64,
    /// Suspect blocks (activity-log extents after a crash) compared by checksum as sync
    /// source: 8 bytes sent each, data only where they differed (counted in `resync_blocks`).
    resync_compared_blocks: u64,
    /// Blocks this node applied as sync target.
    resync_applied_blocks: u64,
    /// Resyncs that moved nothing for the stall timeout and were started again.
    resync_stalls: u64,
    peer_lost: u64,
    refused: u64,
}

#[derive(Serialize)]
struct StatusView {
    sessions: Vec<SessionView>,
    /// With `[cluster]`: the pair state of every LUN.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pairs: Vec<PairView>,
    /// Accepted connections open now, those still logging in included.
    open_connections: usize,
    /// Hits of each `[limits]` bound since start.
    limit_hits: std::collections::BTreeMap<&'static str, u64>,
}

fn digest(on: bool) -> &'static str {
    if on {
        "CRC32C"
    } else {
        "None"
    }
}

fn snapshot(server: &Server) -> StatusView {
    let mut sessions: Vec<_> = server.sessions.lock().by_tsih.values().cloned().collect();
    sessions.sort_by_key(|s| s.nexus.id);
    let node = server.config().cluster.as_ref().map_or(0, |c| c.node);
    let pairs = server
        .targets
        .iter()
        .flat_map(|t| {
            t.pairs
                .iter()
                .map(move |(lun, p)| (t.name.clone(), *lun, p.status()))
        })
        .map(|(target, lun, s)| PairView {
            target,
            lun,
            node,
            role: s.state,
            epoch: s.epoch,
            peer_connected: s.peer_connected,
            alua: match s.alua {
                replication::Alua::ActiveOptimized => "active-optimized",
                replication::Alua::Transitioning => "transitioning",
                replication::Alua::Unavailable => "unavailable",
            },
            resync_remaining: s.resync_remaining,
            dirty_regions: s.dirty_regions,
            resync_blocks: s.stats.resync_blocks,
            resync_compared_blocks: s.stats.resync_compared_blocks,
            resync_applied_blocks: s.stats.resync_applied_blocks,
            resync_stalls: s.stats.resync_stalls,
            peer_lost: s.stats.peer_lost,
            refused: s.stats.refused,
        })
        .collect();
    StatusView {
        pairs,
        open_connections: server.limits.open_connections(),
        limit_hits: server
            .limits
            .log
            .totals()
            .map(|(l, n)| (l.name(), n))
            .collect(),
        sessions: sessions
            .iter()
            .map(|s| SessionView {
                id: s.nexus.id,
                initiator: s.initiator_name.to_string(),
                isid: format!(
                    "0x{}",
                    s.isid
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                ),
                tsih: s.tsih,
                target: s
                    .target
                    .as_ref()
                    .map(|t| t.name.clone())
                    .unwrap_or_else(|| "(discovery)".into()),
                tpgt: s.tpgt,
                connections: s
                    .connections
                    .lock()
                    .iter()
                    .map(|c| {
                        let st = c.stats.snapshot();
                        ConnectionView {
                            cid: c.cid,
                            portal: c.portal.to_string(),
                            peer: c.peer.to_string(),
                            header_digest: digest(c.stats.header_digest.load(Ordering::Relaxed)),
                            data_digest: digest(c.stats.data_digest.load(Ordering::Relaxed)),
                            commands: st.commands,
                            bytes_in: st.bytes_in,
                            bytes_out: st.bytes_out,
                            pdus_in: st.pdus_in,
                            pdus_out: st.pdus_out,
                            writes_out: st.writes_out,
                        }
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Implicit ALUA (SPC-4 5.16): the administrator moves a portal group to another state on
/// every target exported there; logical units raise ASYMMETRIC ACCESS STATE CHANGED on every
/// nexus. Request: `{"cmd":"alua","group":N,"state":"standby"}`.
/// The running configuration records the new state, so `lanes config show` tells the truth
/// and a reload moves the group back to what the file says.
fn set_alua(server: &Server, req: &serde_json::Value) -> serde_json::Value {
    use crate::config::AluaStateConfig;
    use serde::Deserialize as _;
    let group = req
        .get("group")
        .and_then(|g| g.as_u64())
        .and_then(|g| u16::try_from(g).ok());
    let configured = req
        .get("state")
        .and_then(|s| s.as_str())
        .and_then(|s| AluaStateConfig::deserialize(serde_json::Value::from(s)).ok());
    let (Some(group), Some(configured)) = (group, configured) else {
        return serde_json::json!({"error": "need group (a portal group tag) and state (active-optimized, active-non-optimized, standby, unavailable or transitioning)"});
    };
    let state = crate::target::alua_state(configured);
    let mut changed = Vec::new();
    for t in &server.targets {
        if t.on_portal_group(group) && t.tpgs.set_state(group, state) {
            changed.push(t.name.clone());
        }
    }
    if changed.is_empty() {
        return serde_json::json!({"error": format!("no target is exported on portal group {group}")});
    }
    let mut config = (*server.config()).clone();
    if let Some(g) = config.portal_groups.iter_mut().find(|g| g.tag == group) {
        g.alua_state = configured;
    }
    server.set_config(std::sync::Arc::new(config));
    info!(group, ?state, targets = ?changed, "ALUA state changed");
    serde_json::json!({"ok": true, "group": group, "targets": changed})
}

/// `{"cmd":"reload"}`: `{"ok":true,"file","changes":[...],"sessions_ended",
/// "connections_ended"}`, or `{"error": "..."}` (and then nothing changed).
fn reload_reply(result: Result<crate::ReloadReport, crate::ReloadError>) -> serde_json::Value {
    match result {
        Ok(report) => serde_json::json!({
            "ok": true,
            "file": report.file.display().to_string(),
            "changes": report
                .changes
                .iter()
                .map(ToString::to_string)
                .chain(report.others.iter().cloned())
                .collect::<Vec<_>>(),
            "sessions_ended": report.sessions_ended,
            "connections_ended": report.connections_ended,
        }),
        Err(e) => serde_json::json!({"error": e.to_string(), "key": e.key()}),
    }
}

/// The `status` reply: the iSCSI view and each other service's section under its key.
fn status_reply(server: &Server) -> serde_json::Value {
    let mut reply = serde_json::to_value(snapshot(server)).unwrap_or_default();
    if let Some(map) = reply.as_object_mut() {
        for section in &server.sections {
            map.insert(section.key().to_string(), section.status());
        }
    }
    reply
}

/// Prometheus text exposition of the same counters.
fn metrics_text(server: &Server) -> String {
    let view = snapshot(server);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP lanes_sessions Logged-in iSCSI sessions.\n# TYPE lanes_sessions gauge"
    );
    let _ = writeln!(out, "lanes_sessions {}", view.sessions.len());
    crate::limits::write_metrics(&server.limits, &mut out);
    for section in &server.sections {
        section.metrics(&mut out);
    }
    for (name, help) in [
        ("commands", "SCSI commands received"),
        ("bytes_in", "Bytes received"),
        ("bytes_out", "Bytes sent"),
    ] {
        let _ = writeln!(out, "# HELP lanes_connection_{name}_total {help}.");
        let _ = writeln!(out, "# TYPE lanes_connection_{name}_total counter");
        for s in &view.sessions {
            for c in &s.connections {
                let v = match name {
                    "commands" => c.commands,
                    "bytes_in" => c.bytes_in,
                    _ => c.bytes_out,
                };
                let _ = writeln!(
                    out,
                    "lanes_connection_{name}_total{{initiator=\"{}\",isid=\"{}\",tsih=\"{}\",cid=\"{}\",portal=\"{}\",peer=\"{}\"}} {v}",
                    s.initiator, s.isid, s.tsih, c.cid, c.portal, c.peer
                );
            }
        }
    }
    out
}

/// Starts the status socket and, if configured, the metrics endpoint.
pub async fn start(server: &Arc<Server>) -> Result<Vec<tokio::task::JoinHandle<()>>, Error> {
    let mut tasks = Vec::new();
    let config = server.config();
    let path = config.status_socket_path();
    let status_err = |source| Error::Status {
        path: path.display().to_string(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(status_err)?;
    }
    // A socket file left by a previous run that is no longer listening is replaced.
    if path.exists() && std::os::unix::net::UnixStream::connect(&path).is_err() {
        let _ = std::fs::remove_file(&path);
    }
    let listener = UnixListener::bind(&path).map_err(status_err)?;
    let s = server.clone();
    tasks.push(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let s = s.clone();
            tokio::spawn(async move {
                let (rd, mut wr) = stream.into_split();
                let mut line = String::new();
                let mut rd = BufReader::new(rd.take(4096));
                if rd.read_line(&mut line).await.is_err() {
                    return;
                }
                let req = serde_json::from_str::<serde_json::Value>(&line).unwrap_or_default();
                let reply = match req.get("cmd").and_then(|c| c.as_str()) {
                    Some("alua") => {
                        // Not in the middle of a reload, which replaces the running config.
                        let _one_at_a_time = s.reload_lock.lock().await;
                        set_alua(&s, &req).to_string()
                    }
                    Some("reload") => reload_reply(crate::reload::reload(&s).await).to_string(),
                    Some("config") => serde_json::json!({
                        "toml": s.config().to_toml(),
                        "file": s.source.file().map(|f| f.display().to_string()),
                    })
                    .to_string(),
                    _ => status_reply(&s).to_string(),
                };
                let _ = wr.write_all(reply.as_bytes()).await;
                let _ = wr.write_all(b"\n").await;
            });
        }
    }));
    if let Some(addr) = config.metrics_addr {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        info!(%addr, "metrics on http://{addr}/metrics");
        let s = server.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { continue };
                let s = s.clone();
                tokio::spawn(async move {
                    let mut req = [0u8; 2048];
                    let n = match tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut req)).await {
                        Ok(Ok(n)) => n,
                        _ => return,
                    };
                    let head = String::from_utf8_lossy(req.get(..n).unwrap_or_default());
                    let (status, body) = if head.starts_with("GET /metrics") {
                        ("200 OK", metrics_text(&s))
                    } else {
                        ("404 Not Found", "not found\n".to_string())
                    };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    if let Err(e) = stream.write_all(resp.as_bytes()).await {
                        warn!("metrics write: {e}");
                    }
                });
            }
        }));
    }
    Ok(tasks)
}
