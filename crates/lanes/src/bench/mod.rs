//! `lanes bench`: the seeds' benchmark patterns (DiskSpd-style 8 threads x 8 outstanding I/Os)
//! against an iSCSI URL (through lanes' own initiator) or a file or block device (blocking
//! I/O on a thread per outstanding request); fio-like table with CPU use, JSON, PNG charts.
//!
//! Every task owns a disjoint slice of the tested region (sequential patterns stream through
//! their slice; random ones pick block-aligned offsets in it), so `--verify` never races two
//! writes of the same block and can keep, per 4 KiB, the stamp of the last write (`Oracle`) to
//! catch stale reads as well as misplaced or torn blocks.

mod chart;
mod file;
mod histogram;
mod iscsi;
mod meter;
mod pattern;
pub(crate) mod smb;
mod verify;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use serde_json::json;

use pattern::{parse_duration, parse_size, Pattern};
use verify::Oracle;
use workload::Outcome;

const DEFAULT_INITIATOR: &str = "iqn.2026-11.io.lanes:bench";

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Draw a PNG bar chart from `lanes bench --json` files: bars per pattern, one series
    /// per file.
    Chart(chart::ChartArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// What to measure: iscsi://[user%secret@]HOST[:PORT]/IQN/LUN,
    /// smb://[DOMAIN;]USER@HOST[:PORT]/SHARE[/FILE], a block device, or a file (a path that does
    /// not exist is created with --size bytes and written once).
    #[arg(value_name = "TARGET", required = true)]
    target: Option<String>,
    /// Patterns, comma-separated or repeated: 4k-randread, 4k-randwrite, 8k-randrw-67,
    /// 8k-seqrw-67, 64k-seqread, 64k-seqwrite, 128k-seqread, 256k-seqread, 256k-seqwrite,
    /// 1m-seqread, 1m-seqwrite, 1m-seqread-qd1. SMB takes SIZE-seqread, SIZE-seqwrite, SIZE-randread, SIZE-randwrite
    /// [SMB default: 1m-seqread,1m-seqwrite,4k-randread,4k-randwrite].
    #[arg(long, value_delimiter = ',', value_name = "P")]
    pattern: Vec<String>,
    /// iSCSI: sessions (each its own ISID and connection); files: threads; SMB: I/Os in flight
    /// are threads x depth.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Outstanding I/Os per thread.
    #[arg(long, default_value_t = 8)]
    depth: usize,
    /// Measured time per pattern (e.g. 10s, 500ms, 1m).
    #[arg(long, default_value = "10s")]
    duration: String,
    /// Bytes to use from the start of the LUN or file (e.g. 256M) [default: all of it].
    #[arg(long)]
    size: Option<String>,
    /// Write blocks carrying their LBA and a checksum, check every block read.
    #[arg(long)]
    verify: bool,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also draw the results as a PNG bar chart (MB/s per pattern) to FILE.
    #[arg(long, value_name = "FILE.png")]
    chart: Option<PathBuf>,
    /// Name of this configuration in the JSON and in charts [default: the target].
    #[arg(long)]
    label: Option<String>,
    /// Files and devices: go through the page cache instead of O_DIRECT.
    #[arg(long)]
    buffered: bool,
    /// Initiator name used to log in.
    #[arg(long, default_value = DEFAULT_INITIATOR)]
    initiator_name: String,
    #[command(flatten)]
    smb: smb::SmbArgs,
}

/// The validated options every driver runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    patterns: Vec<Pattern>,
    duration: Duration,
    threads: usize,
    depth: usize,
    /// Bytes of the target to use, from its start.
    size: Option<u64>,
    verify: bool,
    buffered: bool,
    initiator_name: String,
}

impl Settings {
    fn new(args: &RunArgs) -> anyhow::Result<Settings> {
        let patterns = args
            .pattern
            .iter()
            .map(|p| pattern::pattern(p.trim()))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if patterns.is_empty() {
            bail!("give at least one --pattern");
        }
        if args.threads == 0 || args.depth == 0 || args.threads > 256 || args.depth > 128 {
            bail!("--threads must be 1..=256 and --depth 1..=128");
        }
        Ok(Settings {
            patterns,
            duration: parse_duration(&args.duration)?,
            threads: args.threads,
            depth: args.depth,
            size: args.size.as_deref().map(parse_size).transpose()?,
            verify: args.verify,
            buffered: args.buffered,
            initiator_name: args.initiator_name.clone(),
        })
    }

    /// Whether any pattern reads (then `--verify` stamps the region first).
    fn reads(&self) -> bool {
        self.patterns.iter().any(|p| p.read_percent > 0)
    }

    /// The `--verify` stamp table for a region, or None without `--verify`.
    fn oracle(&self, region_blocks: u64, bs: usize) -> anyhow::Result<Option<Arc<Oracle>>> {
        if !self.verify {
            return Ok(None);
        }
        Ok(Some(Arc::new(Oracle::new(region_blocks, bs)?)))
    }
}

/// What a run measured, for the JSON file and the chart.
pub struct Report {
    target: String,
    kind: &'static str,
    region_bytes: u64,
    block_size: usize,
    /// Files and devices: whether O_DIRECT was used.
    direct: Option<bool>,
    outcomes: Vec<Outcome>,
}

impl Report {
    fn new(target: String, kind: &'static str, region_bytes: u64, block_size: usize) -> Report {
        Report {
            target,
            kind,
            region_bytes,
            block_size,
            direct: None,
            outcomes: Vec::new(),
        }
    }
}

/// A line on stderr about how the run is done (not an error).
fn note(msg: &str) {
    eprintln!("lanes bench: note: {msg}");
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        Some(BenchCommand::Chart(c)) => chart::run(c),
        None => run_bench(args.run).await,
    }
}

async fn run_bench(args: RunArgs) -> anyhow::Result<()> {
    let target = args.target.clone().context("give a TARGET")?;
    if target.starts_with("smb://") {
        return smb::run(&target, &args).await;
    }
    let settings = Settings::new(&args)?;
    if args.chart.is_some() {
        // A missing font should not cost a whole run first.
        chart::font()?;
    }
    let report = if target.contains("://") {
        iscsi::run(&target, &settings).await?
    } else {
        let s = settings.clone();
        let path = PathBuf::from(&target);
        tokio::task::spawn_blocking(move || file::run(&path, &s))
            .await
            .context("file benchmark")??
    };
    let label = args.label.clone().unwrap_or_else(|| report.target.clone());
    if let Some(path) = &args.json {
        let doc = json!({
            "label": label,
            "target": report.target,
            "kind": report.kind,
            "direct": report.direct,
            "threads": settings.threads,
            "depth": settings.depth,
            "duration_s": settings.duration.as_secs_f64(),
            "region_bytes": report.region_bytes,
            "block_size": report.block_size,
            "verify": settings.verify,
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "results": report.outcomes.iter().map(Outcome::json).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.chart {
        let series = chart::Series {
            label,
            values: report
                .outcomes
                .iter()
                .map(|o| (o.pattern.name.to_string(), o.mb_per_s()))
                .collect(),
        };
        let title = format!("lanes bench {}: MB/s per pattern", report.target);
        chart::draw(path, &title, chart::Metric::MbPerS, &[series], (1280, 720))?;
    }
    let verify_errors: u64 = report.outcomes.iter().map(|o| o.merged.verify_errors).sum();
    if verify_errors > 0 {
        bail!("{verify_errors} blocks failed verification");
    }
    Ok(())
}
