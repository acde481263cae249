//! `lanes status`: asks a running `lanes serve` for its sessions over the status socket and
//! prints them as tables, like a NAS's `cifs session show` / `cifs connection show`; asked on
//! a `lanes attach` socket, it prints the device's paths instead.
//!
//! Protocol: one JSON line `{"cmd":"status"}` out, one JSON document back, expected shaped as
//! `{"sessions":[{"id", "initiator", "isid", "tsih", "target", "connections":[{"cid",
//! "portal", "peer", "header_digest", "data_digest", "commands", "bytes_in", "bytes_out"}]}]}`.
//! Missing fields print as `-`, so the two sides can evolve independently.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Status socket of the running server [default: $LANES_SOCKET, else
    /// ./lanes-data/lanes.sock, else the packaged service's /var/lib/lanes/lanes.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Print the raw JSON reply.
    #[arg(long)]
    json: bool,
    /// On a `lanes attach` socket: fail back now (the failover policy with `--failback manual`).
    #[arg(long)]
    failback: bool,
}

fn socket_path(socket: Option<PathBuf>) -> PathBuf {
    socket
        .or_else(|| std::env::var_os("LANES_SOCKET").map(PathBuf::from))
        .unwrap_or_else(|| default_socket(|path| path.exists()))
}

/// The socket of a `lanes serve` started in this directory, else that of the packaged service
/// (lanes.service, data in /var/lib/lanes); the first when neither exists, for the error.
fn default_socket(exists: impl Fn(&std::path::Path) -> bool) -> PathBuf {
    let local = PathBuf::from("lanes-data/lanes.sock");
    let service = PathBuf::from("/var/lib/lanes/lanes.sock");
    if !exists(&local) && exists(&service) {
        service
    } else {
        local
    }
}

/// Sends one JSON request line to a running server and returns its JSON reply.
pub async fn request(socket: Option<PathBuf>, request: &Value) -> anyhow::Result<Value> {
    let socket = socket_path(socket);
    let stream = tokio::net::UnixStream::connect(&socket)
        .await
        .with_context(|| {
            format!(
                "connecting to {} (is lanes serve running?)",
                socket.display()
            )
        })?;
    let (read, mut write) = stream.into_split();
    write.write_all(format!("{request}\n").as_bytes()).await?;
    write.shutdown().await?;
    let mut reply = String::new();
    BufReader::new(read).read_line(&mut reply).await?;
    serde_json::from_str(&reply).context("the server's reply is not JSON")
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    if args.failback {
        let reply = request(args.socket, &serde_json::json!({"cmd": "failback"})).await?;
        if let Some(e) = reply.get("error").and_then(Value::as_str) {
            anyhow::bail!("{e}");
        }
        println!("failback requested");
        return Ok(());
    }
    let value = request(args.socket, &serde_json::json!({"cmd": "status"})).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", render(&value));
    }
    Ok(())
}

/// `lanes alua`: moves a portal group of a running server to another ALUA state (implicit
/// ALUA); hosts see ASYMMETRIC ACCESS STATE CHANGED and re-read the port groups.
#[derive(Debug, Args)]
pub struct AluaArgs {
    /// Portal group tag (the target port group id).
    #[arg(long)]
    group: u16,
    /// New state.
    #[arg(long, value_parser = ["active-optimized", "active-non-optimized", "standby", "unavailable", "transitioning"])]
    state: String,
    /// Status socket of the running server [default: $LANES_SOCKET, else
    /// ./lanes-data/lanes.sock, else the packaged service's /var/lib/lanes/lanes.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

pub async fn alua(args: AluaArgs) -> anyhow::Result<()> {
    let reply = request(
        args.socket,
        &serde_json::json!({"cmd": "alua", "group": args.group, "state": args.state}),
    )
    .await?;
    if let Some(e) = reply.get("error").and_then(Value::as_str) {
        anyhow::bail!("{e}");
    }
    println!(
        "portal group {} is now {} on {}",
        args.group,
        args.state,
        field(&reply, "targets")
    );
    Ok(())
}

pub(crate) fn field(value: &Value, key: &str) -> String {
    match value.get(key) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// Left-aligned columns sized to their widest cell.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    out += &line(widths.iter().map(|w| "-".repeat(*w)).collect());
    for row in rows {
        out += &line(row.clone());
    }
    out
}

/// An attached multipath device: the device line, then one row per path and its recent
/// state changes.
fn render_device(value: &Value) -> String {
    let empty = Vec::new();
    let dev = value.get("device").cloned().unwrap_or(Value::Null);
    let paths = value
        .get("paths")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let mut out = format!(
        "Device {} ({} bytes, {}-byte blocks) on {}\npolicy {}, replayed {}, fenced {}\n\nPaths ({})\n",
        field(&dev, "lun_id"),
        field(&dev, "size"),
        field(&dev, "block_size"),
        field(&dev, "target"),
        field(&dev, "policy"),
        field(&dev, "replayed"),
        field(&dev, "fences"),
        paths.len()
    );
    let rows: Vec<Vec<String>> = paths
        .iter()
        .map(|p| {
            vec![
                field(p, "path"),
                field(p, "portal"),
                field(p, "state"),
                field(p, "alua"),
                field(p, "in_use"),
                field(p, "inflight"),
                field(p, "iops"),
                field(p, "mb_per_s"),
                field(p, "p50_us"),
                field(p, "p99_us"),
                field(p, "errors"),
            ]
        })
        .collect();
    out += &table(
        &[
            "PATH", "PORTAL", "STATE", "ALUA", "IN USE", "INFLIGHT", "IOPS", "MB/S", "P50 US",
            "P99 US", "ERRORS",
        ],
        &rows,
    );
    let mut changes = Vec::new();
    for p in paths {
        for c in p.get("changes").and_then(Value::as_array).unwrap_or(&empty) {
            let at = c.get("at").and_then(Value::as_f64).unwrap_or(0.0);
            changes.push((at, field(p, "path"), field(c, "to"), field(c, "reason")));
        }
    }
    changes.sort_by(|a, b| a.0.total_cmp(&b.0));
    if !changes.is_empty() {
        out += "\nRecent state changes\n";
        let skip = changes.len().saturating_sub(10);
        let rows: Vec<Vec<String>> = changes
            .into_iter()
            .skip(skip)
            .map(|(at, path, to, reason)| vec![format_time(at), path, to, reason])
            .collect();
        out += &table(&["TIME (UTC)", "PATH", "TO", "REASON"], &rows);
    }
    out
}

/// Seconds since the epoch as `HH:MM:SS.mmm` UTC.
fn format_time(at: f64) -> String {
    let ms = (at * 1000.0) as u64;
    let day = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day / 3_600_000,
        day / 60_000 % 60,
        day / 1000 % 60,
        day % 1000
    )
}

/// The two tables: sessions, then connections (or the paths of an attached device).
pub fn render(value: &Value) -> String {
    if value.get("paths").is_some() {
        return render_device(value);
    }
    let empty = Vec::new();
    let sessions = value
        .get("sessions")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let mut session_rows = Vec::new();
    let mut connection_rows = Vec::new();
    for session in sessions {
        let connections = session
            .get("connections")
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        session_rows.push(vec![
            field(session, "id"),
            field(session, "initiator"),
            field(session, "isid"),
            field(session, "tsih"),
            field(session, "target"),
            connections.len().to_string(),
        ]);
        for connection in connections {
            connection_rows.push(vec![
                field(session, "id"),
                field(connection, "cid"),
                field(connection, "portal"),
                field(connection, "peer"),
                field(connection, "header_digest"),
                field(connection, "data_digest"),
                field(connection, "commands"),
                field(connection, "bytes_in"),
                field(connection, "bytes_out"),
            ]);
        }
    }
    let mut out = format!("Sessions ({})\n", session_rows.len());
    out += &table(
        &["ID", "INITIATOR", "ISID", "TSIH", "TARGET", "CONNS"],
        &session_rows,
    );
    out += &format!("\nConnections ({})\n", connection_rows.len());
    out += &table(
        &[
            "SESSION",
            "CID",
            "PORTAL",
            "PEER",
            "HDIGEST",
            "DDIGEST",
            "COMMANDS",
            "BYTES IN",
            "BYTES OUT",
        ],
        &connection_rows,
    );
    if let Some(pairs) = value.get("pairs").and_then(Value::as_array) {
        let rows: Vec<Vec<String>> = pairs
            .iter()
            .map(|p| {
                [
                    "target",
                    "lun",
                    "node",
                    "role",
                    "epoch",
                    "peer_connected",
                    "alua",
                    "resync_remaining",
                    "dirty_regions",
                    "resync_blocks",
                ]
                .iter()
                .map(|k| field(p, k))
                .collect()
            })
            .collect();
        out += &format!("\nHA pair ({} LUNs)\n", rows.len());
        out += &table(
            &[
                "TARGET",
                "LUN",
                "NODE",
                "ROLE",
                "EPOCH",
                "PEER",
                "ALUA",
                "RESYNC LEFT",
                "DIRTY",
                "RESYNCED BLOCKS",
            ],
            &rows,
        );
    }
    if let Some(smb) = value.get("smb") {
        out += &crate::status_smb::render(smb);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_socket_prefers_the_local_server_then_the_service() {
        let local = PathBuf::from("lanes-data/lanes.sock");
        let service = PathBuf::from("/var/lib/lanes/lanes.sock");
        assert_eq!(default_socket(|_| true), local);
        assert_eq!(default_socket(|p| p == service.as_path()), service);
        assert_eq!(default_socket(|_| false), local);
    }

    #[test]
    fn renders_sessions_and_connections() {
        let reply = serde_json::json!({"sessions": [{
            "id": 1, "initiator": "iqn.2005-03.org.open-iscsi:host1", "isid": "0x23d000000001",
            "tsih": 1, "target": "iqn.2026-11.io.lanes:nas",
            "connections": [
                {"cid": 0, "portal": "192.0.2.10:3260", "peer": "192.0.2.50:51000",
                 "header_digest": "None", "data_digest": "CRC32C", "commands": 42,
                 "bytes_in": 4096, "bytes_out": 8192},
                {"cid": 1, "portal": "198.51.100.10:3260", "peer": "198.51.100.50:51001"}
            ]
        }]});
        let text = render(&reply);
        assert!(text.starts_with("Sessions (1)\nID  INITIATOR"), "{text}");
        assert!(text.contains("0x23d000000001"));
        assert!(text.contains("Connections (2)"));
        assert!(text.contains("192.0.2.10:3260"));
        assert!(text.contains("CRC32C"));
        let second = text.lines().last().unwrap();
        assert!(
            second.contains("198.51.100.10:3260") && second.contains(" - "),
            "{second}"
        );
    }

    #[test]
    fn renders_an_attached_device() {
        let reply = serde_json::json!({
            "device": {"lun_id": "naa.6001", "size": 1024, "block_size": 512,
                       "target": "iqn.t", "policy": "service-time", "replayed": 3, "fences": 1},
            "paths": [
                {"path": "path0", "portal": "10.1.0.2:3260", "state": "failed", "alua": "active/optimized",
                 "in_use": false, "inflight": 0, "iops": 0, "mb_per_s": 0.0, "p50_us": 0, "p99_us": 0,
                 "errors": 2, "changes": [{"at": 3661.5, "to": "failed", "reason": "3 pings unanswered"}]},
                {"path": "path1", "portal": "10.2.0.2:3260", "state": "active", "in_use": true}
            ]
        });
        let text = render(&reply);
        assert!(text.starts_with("Device naa.6001"), "{text}");
        assert!(text.contains("replayed 3, fenced 1"));
        assert!(text.contains("Paths (2)"));
        assert!(
            text.contains("01:01:01.500  path0  failed  3 pings unanswered"),
            "{text}"
        );
    }

    #[test]
    fn renders_nothing_running() {
        let text = render(&serde_json::json!({"sessions": []}));
        assert!(text.contains("Sessions (0)") && text.contains("Connections (0)"));
    }

    #[test]
    fn renders_the_pair_of_each_replicated_lun() {
        let text = render(&serde_json::json!({"sessions": [], "pairs": [{
            "target": "iqn.2026-11.io.lanes:pair", "lun": 0, "node": 2, "role": "ResyncSource",
            "epoch": 3, "peer_connected": true, "alua": "active-optimized",
            "resync_remaining": 1234, "dirty_regions": 1300, "resync_blocks": 66
        }]}));
        assert!(text.contains("HA pair (1 LUNs)"), "{text}");
        let row = text.lines().last().unwrap_or_default();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "iqn.2026-11.io.lanes:pair",
                "0",
                "2",
                "ResyncSource",
                "3",
                "true",
                "active-optimized",
                "1234",
                "1300",
                "66"
            ]
        );
        let plain = render(&serde_json::json!({"sessions": []}));
        assert!(!plain.contains("HA pair"));
    }
}
