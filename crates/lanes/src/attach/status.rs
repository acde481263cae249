//! The status socket of `lanes attach` (`lanes status --socket ...`) and its Prometheus
//! metrics: per path the portal, state, ALUA state, load, rates, latency, errors and recent
//! state changes. Requests: `{"cmd":"status"}` and `{"cmd":"failback"}`, one JSON line each.

use lanes_initiator::{Multipath, MultipathStatus};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, UnixListener};

pub struct StatusServer {
    unix: UnixListener,
    path: PathBuf,
    metrics: Option<TcpListener>,
}

/// The status as JSON (what `lanes status` renders).
pub fn to_json(st: &MultipathStatus) -> Value {
    let paths: Vec<Value> = st
        .paths
        .iter()
        .map(|p| {
            json!({
                "path": p.path,
                "portal": p.portal.to_string(),
                "portal_group": p.portal_group,
                "state": p.state,
                "alua": p.alua,
                "in_use": p.eligible,
                "inflight": p.inflight_cmds,
                "inflight_bytes": p.inflight_bytes,
                "iops": p.iops.round(),
                "mb_per_s": (p.bytes_per_sec / 1e6 * 10.0).round() / 10.0,
                "p50_us": p.p50_us,
                "p99_us": p.p99_us,
                "completed": p.completed,
                "errors": p.errors,
                "changes": p.history.iter().rev().take(5).map(|c| json!({
                    "at": c.at.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0),
                    "to": c.to,
                    "reason": c.reason,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "device": {
            "target": st.target,
            "lun_id": st.lun_id,
            "policy": st.policy,
            "block_size": st.block_size,
            "size": st.size,
            "replayed": st.replayed,
            "fences": st.fences,
        },
        "paths": paths,
    })
}

/// Prometheus text exposition of the same numbers.
pub fn metrics(st: &MultipathStatus) -> String {
    let mut out = String::new();
    let families: [(&str, &str, &str); 7] = [
        ("lanes_path_up", "gauge", "1 when the path carries I/O"),
        (
            "lanes_path_inflight",
            "gauge",
            "commands outstanding on the path",
        ),
        (
            "lanes_path_completed_total",
            "counter",
            "commands completed on the path",
        ),
        (
            "lanes_path_errors_total",
            "counter",
            "path errors (timeouts, lost connections)",
        ),
        (
            "lanes_path_bytes_per_second",
            "gauge",
            "throughput over the last health tick",
        ),
        (
            "lanes_path_latency_p50_seconds",
            "gauge",
            "median latency over the last health tick",
        ),
        (
            "lanes_path_latency_p99_seconds",
            "gauge",
            "p99 latency over the last health tick",
        ),
    ];
    for (i, (name, kind, help)) in families.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for p in &st.paths {
            let v = match i {
                0 => f64::from(u8::from(p.eligible)),
                1 => f64::from(p.inflight_cmds),
                2 => p.completed as f64,
                3 => p.errors as f64,
                4 => p.bytes_per_sec,
                5 => p.p50_us as f64 / 1e6,
                _ => p.p99_us as f64 / 1e6,
            };
            let _ = writeln!(
                out,
                "{name}{{lun=\"{}\",path=\"{}\",portal=\"{}\",state=\"{}\"}} {v}",
                st.lun_id, p.path, p.portal, p.state
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP lanes_replayed_total commands replayed on another path\n# TYPE lanes_replayed_total counter\nlanes_replayed_total{{lun=\"{}\"}} {}",
        st.lun_id, st.replayed
    );
    let _ = writeln!(
        out,
        "# HELP lanes_fences_total failed sessions ended at the target before replay\n# TYPE lanes_fences_total counter\nlanes_fences_total{{lun=\"{}\"}} {}",
        st.lun_id, st.fences
    );
    out
}

impl StatusServer {
    pub async fn bind(path: &Path, metrics: Option<SocketAddr>) -> std::io::Result<StatusServer> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // A socket file left by a process that is gone: nobody answers on it.
        if std::os::unix::net::UnixStream::connect(path).is_err() {
            let _ = std::fs::remove_file(path);
        }
        let unix = UnixListener::bind(path)?;
        let metrics = match metrics {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        Ok(StatusServer {
            unix,
            path: path.to_path_buf(),
            metrics,
        })
    }

    /// Where `/metrics` is served, if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub async fn serve(self, mp: Arc<Multipath>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let metrics = self.metrics;
        let mp2 = mp.clone();
        let http = async move {
            let Some(listener) = metrics else {
                return std::future::pending::<()>().await;
            };
            while let Ok((mut stream, _)) = listener.accept().await {
                let mp = mp2.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 2048];
                    let _ = stream.read(&mut buf).await;
                    let body = metrics_text(&mp);
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(reply.as_bytes()).await;
                });
            }
        };
        let unix = async {
            while let Ok((stream, _)) = self.unix.accept().await {
                let mp = mp.clone();
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut line = String::new();
                    let _ = BufReader::new(read).read_line(&mut line).await;
                    let req: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                    let reply = match req.get("cmd").and_then(Value::as_str) {
                        Some("status") | None => to_json(&mp.status()),
                        Some("failback") => {
                            mp.failback_now();
                            json!({"ok": true})
                        }
                        Some(other) => json!({"error": format!("unknown command '{other}'")}),
                    };
                    let _ = write.write_all(format!("{reply}\n").as_bytes()).await;
                });
            }
        };
        tokio::select! {
            _ = http => {}
            _ = unix => {}
            _ = stop.wait_for(|s| *s) => {}
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn metrics_text(mp: &Multipath) -> String {
    metrics(&mp.status())
}
