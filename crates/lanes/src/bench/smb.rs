//! `lanes bench smb://USER@HOST[:PORT]/SHARE`: argument handling and printing around
//! `lanes_smb_client::bench`, which does the measuring.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use lanes_smb_client::bench::{self, BenchOptions, BenchPattern, DEFAULT_PATTERNS};
use lanes_smb_client::url::SmbUrl;
use serde_json::json;

use super::meter::CpuTimes;
use super::pattern::{parse_duration, parse_size};
use super::RunArgs;

/// Options for smb:// targets.
#[derive(Debug, Args)]
pub struct SmbArgs {
    /// SMB: channels of the session, bound to the interfaces the server reports (or to
    /// --address) in turn [default: one per address].
    #[arg(long)]
    channels: Option<usize>,
    /// SMB: addresses to bind channels to instead of the server's interface list
    /// (comma-separated or repeated).
    #[arg(long, value_delimiter = ',', value_name = "IP")]
    address: Vec<IpAddr>,
    /// SMB: file holding the password (one line) [default: $LANES_SMB_PASSWORD].
    #[arg(long, value_name = "FILE")]
    password_file: Option<PathBuf>,
    /// SMB: encrypt every request (AES-128-GCM) instead of signing it.
    #[arg(long)]
    encrypt: bool,
    /// SMB: give a channel up when it answers nothing for this long with requests waiting,
    /// and send them again on the other channels (e.g. 2s) [default: 5s].
    #[arg(long, value_name = "DURATION")]
    channel_timeout: Option<String>,
}

/// The password from `--password-file` or `$LANES_SMB_PASSWORD`.
pub fn password(file: Option<&PathBuf>) -> anyhow::Result<String> {
    match file {
        Some(f) => Ok(std::fs::read_to_string(f)
            .with_context(|| format!("reading the password from {}", f.display()))?
            .trim_end_matches(['\r', '\n'])
            .to_string()),
        None => std::env::var("LANES_SMB_PASSWORD")
            .context("give --password-file FILE or set LANES_SMB_PASSWORD"),
    }
}

fn cpu_seconds() -> f64 {
    CpuTimes::now().total_s()
}

pub(super) async fn run(target: &str, args: &RunArgs) -> anyhow::Result<()> {
    let url = SmbUrl::parse(target)?;
    let names: Vec<String> = if args.pattern.is_empty() {
        DEFAULT_PATTERNS.iter().map(|s| s.to_string()).collect()
    } else {
        args.pattern.iter().map(|s| s.trim().to_string()).collect()
    };
    let patterns = names
        .iter()
        .map(|n| BenchPattern::parse(n))
        .collect::<Result<Vec<_>, _>>()?;
    let opts = BenchOptions {
        url,
        password: password(args.smb.password_file.as_ref())?,
        channels: args.smb.channels.unwrap_or(0),
        addresses: args.smb.address.clone(),
        encrypt: args.smb.encrypt,
        patterns,
        duration: parse_duration(&args.duration)?,
        size: args
            .size
            .as_deref()
            .map(parse_size)
            .transpose()?
            .unwrap_or(256 << 20),
        queue_depth: args.threads.saturating_mul(args.depth),
        cpu_seconds,
        channel_timeout: args
            .smb
            .channel_timeout
            .as_deref()
            .map(parse_duration)
            .transpose()?,
    };
    let report = bench::run(&opts, |m| eprintln!("lanes bench: {m}")).await?;
    let protection = match (&report.cipher, report.encrypted) {
        (Some(c), true) => format!("encrypted with {c}"),
        _ => format!("signed with {}", report.signing),
    };
    println!(
        "SMB 3.1.1 {} ({protection}), {} channel{}, test file {} MiB, {} I/Os in flight",
        report.server,
        report.channels.len(),
        if report.channels.len() == 1 { "" } else { "s" },
        report.file_size >> 20,
        opts.queue_depth
    );
    for (addr, why) in &report.bind_failures {
        println!("  channel to {addr} not bound: {why}");
    }
    println!(
        "{:<14} {:>5} {:>10} {:>9} {:>9} {:>11}  bytes per channel",
        "pattern", "qd", "IOPS", "MB/s", "CPU s/GB", "longest ms"
    );
    for r in &report.results {
        let per: Vec<String> = r
            .channels
            .iter()
            .map(|c| format!("{}={:.1}MB", c.server.ip(), c.bytes as f64 / 1e6))
            .collect();
        println!(
            "{:<14} {:>5} {:>10.0} {:>9.1} {:>9.2} {:>11.1}  {}",
            r.pattern.name,
            r.queue_depth,
            r.iops(),
            r.mb_per_s(),
            r.cpu_s_per_gb(),
            r.longest_io.as_secs_f64() * 1e3,
            per.join(" ")
        );
    }
    if report.channels_lost > 0 {
        println!(
            "channels given up: {}, bound again: {} (their requests were replayed on the others)",
            report.channels_lost, report.channels_rebound
        );
    }
    if let Some(path) = &args.json {
        let doc = json!({
            "label": args.label.clone().unwrap_or_else(|| target.to_string()),
            "target": target,
            "kind": "smb",
            "server": report.server.to_string(),
            "signing": report.signing,
            "cipher": report.cipher,
            "encrypted": report.encrypted,
            "channels": report.channels.iter().map(|c| json!({
                "server": c.server.to_string(),
                "client": c.client.to_string(),
                "requests": c.requests,
                "bytes_read": c.bytes_read,
                "bytes_written": c.bytes_written,
            })).collect::<Vec<_>>(),
            "bind_failures": report.bind_failures.iter().map(|(a, w)| json!({"address": a.to_string(), "error": w})).collect::<Vec<_>>(),
            "region_bytes": report.file_size,
            "channels_lost": report.channels_lost,
            "channels_rebound": report.channels_rebound,
            "timeline_bin_ms": bench::TIMELINE_BIN.as_millis() as u64,
            "depth": opts.queue_depth,
            "duration_s": opts.duration.as_secs_f64(),
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "results": report.results.iter().map(|r| json!({
                "pattern": r.pattern.name,
                "block_size": r.pattern.block,
                "depth": r.queue_depth,
                "seconds": r.seconds,
                "ios": r.ios,
                "bytes": r.bytes,
                "iops": r.iops(),
                "mb_per_s": r.mb_per_s(),
                "cpu_s": r.cpu_seconds,
                "cpu_s_per_gb": r.cpu_s_per_gb(),
                "longest_io_ms": r.longest_io.as_secs_f64() * 1e3,
                "timeline_bytes": r.timeline,
                "channels": r.channels.iter().map(|c| json!({"server": c.server.to_string(), "client": c.client.to_string(), "bytes": c.bytes})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
