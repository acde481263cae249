//! `lanes bench`: the seeds' benchmark patterns (DiskSpd-style 8 threads x 8 outstanding I/Os)
//! against an iSCSI URL, through lanes' own initiator; fio-like table and JSON.
//!
//! Threads are sessions: each thread logs in with its own ISID (one TCP connection, one
//! CmdSN window), as DiskSpd threads on an MPIO host end up spread over sessions. Each thread
//! runs `depth` tasks with one command outstanding each, so the target sees threads x depth
//! commands in flight. Every task owns a disjoint slice of the tested region (sequential
//! patterns stream through their slice; random ones pick block-aligned offsets in it), so
//! `--verify` never races two writes of the same block and can keep, per 4 KiB, the stamp of
//! the last write (`Oracle`) to catch stale reads as well as misplaced or torn blocks.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::{Bytes, BytesMut};
use clap::Args;
use lanes_initiator::{ChapSecret, IscsiUrl, LoginOptions, Session};
use serde_json::{json, Value};

const DEFAULT_INITIATOR: &str = "iqn.2026-11.io.lanes:bench";

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure: iscsi://[user%secret@]HOST[:PORT]/IQN/LUN.
    #[arg(value_name = "TARGET")]
    target: String,
    /// Patterns, comma-separated or repeated: 4k-randread, 4k-randwrite, 8k-randrw-67,
    /// 8k-seqrw-67, 64k-seqread, 64k-seqwrite, 256k-seqread, 256k-seqwrite, 1m-seqread-qd1.
    #[arg(long, value_delimiter = ',', required = true, value_name = "P")]
    pattern: Vec<String>,
    /// Sessions (each its own ISID and connection).
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Outstanding commands per thread.
    #[arg(long, default_value_t = 8)]
    depth: usize,
    /// Measured time per pattern (e.g. 10s, 500ms, 1m).
    #[arg(long, default_value = "10s")]
    duration: String,
    /// Bytes of the LUN to use from its start (e.g. 256M) [default: the whole LUN].
    #[arg(long)]
    size: Option<String>,
    /// Write blocks carrying their LBA and a checksum, check every block read.
    #[arg(long)]
    verify: bool,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Initiator name used to log in.
    #[arg(long, default_value = DEFAULT_INITIATOR)]
    initiator_name: String,
}

/// One access pattern of the seeds.
#[derive(Debug, Clone, Copy)]
struct Pattern {
    name: &'static str,
    block: usize,
    /// Share of reads, in percent.
    read_percent: u64,
    random: bool,
    /// Fixed queue depth 1 on one thread.
    qd1: bool,
}

const PATTERNS: &[Pattern] = &[
    Pattern {
        name: "4k-randread",
        block: 4096,
        read_percent: 100,
        random: true,
        qd1: false,
    },
    Pattern {
        name: "4k-randwrite",
        block: 4096,
        read_percent: 0,
        random: true,
        qd1: false,
    },
    Pattern {
        name: "8k-randrw-67",
        block: 8192,
        read_percent: 67,
        random: true,
        qd1: false,
    },
    Pattern {
        name: "8k-seqrw-67",
        block: 8192,
        read_percent: 67,
        random: false,
        qd1: false,
    },
    Pattern {
        name: "64k-seqread",
        block: 65536,
        read_percent: 100,
        random: false,
        qd1: false,
    },
    Pattern {
        name: "64k-seqwrite",
        block: 65536,
        read_percent: 0,
        random: false,
        qd1: false,
    },
    Pattern {
        name: "256k-seqread",
        block: 262_144,
        read_percent: 100,
        random: false,
        qd1: false,
    },
    Pattern {
        name: "256k-seqwrite",
        block: 262_144,
        read_percent: 0,
        random: false,
        qd1: false,
    },
    Pattern {
        name: "1m-seqread-qd1",
        block: 1 << 20,
        read_percent: 100,
        random: false,
        qd1: true,
    },
];

fn pattern(name: &str) -> anyhow::Result<Pattern> {
    PATTERNS
        .iter()
        .find(|p| p.name == name)
        .copied()
        .with_context(|| {
            let known: Vec<_> = PATTERNS.iter().map(|p| p.name).collect();
            format!("unknown pattern '{name}' (known: {})", known.join(", "))
        })
}

fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let bad = || format!("bad --duration '{s}': expected e.g. 10s, 500ms, 2m");
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let n: f64 = num.trim().parse().ok().with_context(bad)?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        _ => bail!(bad()),
    };
    if !(secs.is_finite() && secs > 0.0 && secs < 86_400.0) {
        bail!(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_size(s: &str) -> anyhow::Result<u64> {
    let bad = || format!("bad --size '{s}': expected e.g. 64M, 1G, 1048576");
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let n: f64 = num.trim().parse().ok().with_context(bad)?;
    let mult = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => bail!(bad()),
    };
    let v = n * mult as f64;
    if !(v.is_finite() && v >= 1.0) {
        bail!(bad());
    }
    Ok(v as u64)
}

// ---------------------------------------------------------------------------------------------
// Latency histogram
// ---------------------------------------------------------------------------------------------

/// Sub-buckets per power of two: relative precision 1/32 (about 3 %), like HDR with 2 digits.
const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
const LINEAR: u64 = 2 * SUB as u64;
const BUCKETS: usize = LINEAR as usize + (64 - SUB_BITS as usize - 1) * SUB;

/// Log-linear latency histogram in nanoseconds: fixed buckets, no allocation per record.
struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
    sum_ns: u128,
    max_ns: u64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            total: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < LINEAR {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros(); // >= SUB_BITS + 1
        let sub = (v >> (exp - SUB_BITS)) as usize & (SUB - 1);
        LINEAR as usize + (exp - SUB_BITS - 1) as usize * SUB + sub
    }

    /// The smallest value of bucket `i`.
    fn value(i: usize) -> u64 {
        if i < LINEAR as usize {
            return i as u64;
        }
        let k = i - LINEAR as usize;
        let exp = (k / SUB) as u32 + SUB_BITS + 1;
        let sub = (k % SUB) as u64;
        (1u64 << exp) | (sub << (exp - SUB_BITS))
    }

    fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if let Some(c) = self.counts.get_mut(Self::index(ns)) {
            *c += 1;
        }
        self.total += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    fn mean_ns(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        self.sum_ns as f64 / self.total as f64
    }

    /// The value at quantile `q` (0..=1), as the upper end of its bucket.
    fn quantile_ns(&self, q: f64) -> u64 {
        let rank = ((self.total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank && *c > 0 {
                return Self::value(i + 1).saturating_sub(1).min(self.max_ns);
            }
        }
        self.max_ns
    }
}

// ---------------------------------------------------------------------------------------------
// Verification blocks
// ---------------------------------------------------------------------------------------------

fn checksum(words: &[u8]) -> u64 {
    // FNV-1a over 8-byte words: cheap, and any misplaced or torn block fails it.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in words.chunks_exact(8) {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Fills `buf` (whole blocks of `bs`) so each block carries its LBA, a stamp and a checksum.
fn fill_verified(buf: &mut [u8], lba: u64, bs: usize, stamp: u64) {
    for (i, block) in buf.chunks_exact_mut(bs).enumerate() {
        let this = lba + i as u64;
        let (body, sum) = block.split_at_mut(bs - 8);
        let mut x = this.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ stamp;
        for (j, w) in body.chunks_exact_mut(8).enumerate() {
            let v = match j {
                0 => this,
                1 => stamp,
                _ => {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                }
            };
            w.copy_from_slice(&v.to_le_bytes());
        }
        sum.copy_from_slice(&checksum(body).to_le_bytes());
    }
}

/// Counts the blocks of `buf` that are neither never-written (all zero) nor intact at `lba`
/// with the stamp `expected` gives for their LBA (0: any stamp).
fn count_bad_blocks(buf: &[u8], lba: u64, bs: usize, expected: impl Fn(u64) -> u64) -> u64 {
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let mut bad = 0;
    for (i, block) in buf.chunks_exact(bs).enumerate() {
        if block.iter().all(|b| *b == 0) {
            continue;
        }
        let this = lba + i as u64;
        let (body, sum) = block.split_at(bs - 8);
        let want = expected(this);
        if word(&body[..8]) != this
            || word(sum) != checksum(body)
            || (want != 0 && word(&body[8..16]) != want)
        {
            bad += 1;
        }
    }
    bad
}

/// The stamp each 4 KiB grain of the region was last written with (0: unknown), so `--verify`
/// also catches a read returning an older version of a block, not just a misplaced one.
/// Every I/O covers whole grains and each task owns its slice, so plain loads and stores do.
struct Oracle {
    grain_blocks: u64,
    stamps: Vec<AtomicU64>,
}

/// The stamp of blocks written by the prefill.
const PREFILL_STAMP: u64 = 1;
/// Largest table `--verify` keeps (8 bytes per grain): 64 Mi grains, 256 GiB of region.
const MAX_GRAINS: u64 = 64 << 20;

impl Oracle {
    fn new(region_blocks: u64, bs: usize) -> anyhow::Result<Oracle> {
        let grain_blocks = (4096 / bs).max(1) as u64;
        let grains = region_blocks.div_ceil(grain_blocks);
        if grains > MAX_GRAINS {
            bail!("--verify keeps a stamp per 4 KiB and supports up to 256 GiB; use --size");
        }
        Ok(Oracle {
            grain_blocks,
            stamps: (0..grains).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn expected(&self, lba: u64) -> u64 {
        self.stamps
            .get((lba / self.grain_blocks) as usize)
            .map_or(0, |s| s.load(Ordering::Relaxed))
    }

    fn record(&self, lba: u64, blocks: u64, stamp: u64) {
        let first = lba / self.grain_blocks;
        let last = (lba + blocks).div_ceil(self.grain_blocks);
        for g in first..last {
            if let Some(s) = self.stamps.get(g as usize) {
                s.store(stamp, Ordering::Relaxed);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------------

/// What one task measured.
struct TaskResult {
    hist: Histogram,
    reads: u64,
    writes: u64,
    bytes: u64,
    verify_errors: u64,
}

struct Job {
    pattern: Pattern,
    /// First LBA and number of blocks of this task's slice.
    start: u64,
    blocks: u64,
    block_size: usize,
    seed: u64,
    /// Present with --verify.
    oracle: Option<Arc<Oracle>>,
    stop: Arc<AtomicBool>,
}

async fn run_task(session: Arc<Session>, job: Job) -> anyhow::Result<TaskResult> {
    let per_io = (job.pattern.block / job.block_size) as u64;
    let slots = job.blocks / per_io;
    let mut result = TaskResult {
        hist: Histogram::new(),
        reads: 0,
        writes: 0,
        bytes: 0,
        verify_errors: 0,
    };
    let mut rng = job.seed | 1;
    let next = |rng: &mut u64| {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    // Without --verify one buffer of noise serves every write (no allocation per I/O).
    let mut noise = vec![0u8; job.pattern.block];
    fill_verified(&mut noise, 0, job.block_size, job.seed);
    let noise = Bytes::from(noise);
    let mut cursor = 0u64;
    while !job.stop.load(Ordering::Relaxed) {
        let slot = if job.pattern.random {
            next(&mut rng) % slots
        } else {
            let s = cursor;
            cursor = (cursor + 1) % slots;
            s
        };
        let lba = job.start + slot * per_io;
        let is_read = next(&mut rng) % 100 < job.pattern.read_percent;
        let began = Instant::now();
        if is_read {
            let data = session
                .read(lba, per_io as u32)
                .await
                .with_context(|| format!("read at LBA {lba}"))?;
            if let Some(oracle) = &job.oracle {
                result.verify_errors +=
                    count_bad_blocks(&data, lba, job.block_size, |l| oracle.expected(l));
            }
            result.reads += 1;
        } else {
            // Stamps of verified writes have the top bit set: never 0 (unknown) or the prefill's.
            let stamp = next(&mut rng) | 1 << 63;
            let data = if job.oracle.is_some() {
                let mut b = BytesMut::zeroed(job.pattern.block);
                fill_verified(&mut b, lba, job.block_size, stamp);
                b.freeze()
            } else {
                noise.clone()
            };
            session
                .write_bytes(lba, data)
                .await
                .with_context(|| format!("write at LBA {lba}"))?;
            if let Some(oracle) = &job.oracle {
                oracle.record(lba, per_io, stamp);
            }
            result.writes += 1;
        }
        result.hist.record(began.elapsed());
        result.bytes += job.pattern.block as u64;
    }
    Ok(result)
}

/// Fills a slice with verification blocks, so read patterns have something to check.
async fn prefill(
    session: Arc<Session>,
    oracle: Arc<Oracle>,
    start: u64,
    blocks: u64,
    bs: usize,
) -> anyhow::Result<()> {
    let chunk = (262_144 / bs) as u64;
    let mut lba = start;
    while lba < start + blocks {
        let n = chunk.min(start + blocks - lba);
        let mut b = BytesMut::zeroed(n as usize * bs);
        fill_verified(&mut b, lba, bs, PREFILL_STAMP);
        session
            .write_bytes(lba, b.freeze())
            .await
            .with_context(|| format!("prefill at LBA {lba}"))?;
        oracle.record(lba, n, PREFILL_STAMP);
        lba += n;
    }
    Ok(())
}

struct Outcome {
    pattern: Pattern,
    threads: usize,
    depth: usize,
    seconds: f64,
    merged: TaskResult,
}

impl Outcome {
    fn iops(&self) -> f64 {
        (self.merged.reads + self.merged.writes) as f64 / self.seconds
    }
    fn mb_per_s(&self) -> f64 {
        self.merged.bytes as f64 / self.seconds / 1e6
    }
    fn json(&self) -> Value {
        let h = &self.merged.hist;
        json!({
            "pattern": self.pattern.name,
            "block_size": self.pattern.block,
            "threads": self.threads,
            "depth": self.depth,
            "seconds": self.seconds,
            "reads": self.merged.reads,
            "writes": self.merged.writes,
            "bytes": self.merged.bytes,
            "iops": self.iops(),
            "mb_per_s": self.mb_per_s(),
            "lat_avg_us": h.mean_ns() / 1e3,
            "lat_p99_us": h.quantile_ns(0.99) as f64 / 1e3,
            "lat_max_us": h.max_ns as f64 / 1e3,
            "verify_errors": self.merged.verify_errors,
        })
    }
}

/// Slices `blocks` blocks into `n` aligned slices of whole I/Os.
fn slices(region: u64, n: usize, per_io: u64) -> anyhow::Result<Vec<(u64, u64)>> {
    let per = region / n as u64 / per_io * per_io;
    if per == 0 {
        bail!(
            "the tested region is too small for {n} tasks of this block size; use a larger --size"
        );
    }
    Ok((0..n as u64).map(|i| (i * per, per)).collect())
}

async fn login_all(
    url: &IscsiUrl,
    options: &LoginOptions,
    n: usize,
) -> anyhow::Result<Vec<Arc<Session>>> {
    let portal = lanes_initiator::resolve(&url.portal()).await?;
    let mut sessions = Vec::with_capacity(n);
    for _ in 0..n {
        let mut o = options.clone();
        o.isid = lanes_initiator::random_isid();
        let s = Session::login(portal, &url.target, &o)
            .await
            .with_context(|| format!("login to {} at {portal}", url.target))?;
        s.test_unit_ready().await.context("TEST UNIT READY")?;
        s.read_capacity16().await.context("READ CAPACITY")?;
        sessions.push(Arc::new(s));
    }
    Ok(sessions)
}

async fn run_pattern(
    sessions: &[Arc<Session>],
    pattern: Pattern,
    args: &BenchArgs,
    region: u64,
    bs: usize,
    duration: Duration,
    oracle: Option<&Arc<Oracle>>,
) -> anyhow::Result<Outcome> {
    let (threads, depth) = if pattern.qd1 {
        (1, 1)
    } else {
        (args.threads, args.depth)
    };
    let per_io = (pattern.block / bs).max(1) as u64;
    let parts = slices(region, threads * depth, per_io)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (i, (start, blocks)) in parts.into_iter().enumerate() {
        let session = sessions.get(i / depth).context("no session")?.clone();
        let job = Job {
            pattern,
            start,
            blocks,
            block_size: bs,
            seed: 0x1234_5678 ^ ((i as u64 + 1) << 20) ^ u64::from(std::process::id()),
            oracle: oracle.cloned(),
            stop: stop.clone(),
        };
        tasks.push(tokio::spawn(run_task(session, job)));
    }
    let began = Instant::now();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut merged = TaskResult {
        hist: Histogram::new(),
        reads: 0,
        writes: 0,
        bytes: 0,
        verify_errors: 0,
    };
    let mut first_error = None;
    for t in tasks {
        match t.await {
            Ok(Ok(r)) => {
                merged.hist.merge(&r.hist);
                merged.reads += r.reads;
                merged.writes += r.writes;
                merged.bytes += r.bytes;
                merged.verify_errors += r.verify_errors;
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(anyhow::anyhow!("benchmark task failed: {e}"));
            }
        }
    }
    let seconds = began.elapsed().as_secs_f64();
    if let Some(e) = first_error {
        return Err(e.context(format!("pattern {}", pattern.name)));
    }
    Ok(Outcome {
        pattern,
        threads,
        depth,
        seconds,
        merged,
    })
}

fn print_header() {
    println!(
        "{:<16} {:>7} {:>5} {:>10} {:>9} {:>10} {:>10} {:>7}",
        "pattern", "threads", "depth", "IOPS", "MB/s", "avg lat", "p99 lat", "errors"
    );
}

fn print_row(o: &Outcome) {
    let h = &o.merged.hist;
    let ms = |ns: f64| format!("{:.3} ms", ns / 1e6);
    println!(
        "{:<16} {:>7} {:>5} {:>10.0} {:>9.1} {:>10} {:>10} {:>7}",
        o.pattern.name,
        o.threads,
        o.depth,
        o.iops(),
        o.mb_per_s(),
        ms(h.mean_ns()),
        ms(h.quantile_ns(0.99) as f64),
        o.merged.verify_errors
    );
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if !args.target.contains("://") {
        bail!(
            "'{}': block-device and file targets are not supported yet; give an iSCSI URL \
             (iscsi://[user%secret@]HOST[:PORT]/IQN/LUN)",
            args.target
        );
    }
    let url: IscsiUrl = args.target.parse()?;
    let patterns = args
        .pattern
        .iter()
        .map(|p| pattern(p.trim()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let duration = parse_duration(&args.duration)?;
    if args.threads == 0 || args.depth == 0 || args.threads > 256 || args.depth > 128 {
        bail!("--threads must be 1..=256 and --depth 1..=128");
    }
    let mut options = LoginOptions::new(args.initiator_name.clone());
    options.lun = url.lun;
    options.chap = url.chap.as_ref().map(|(user, secret)| ChapSecret {
        user: user.clone(),
        secret: secret.as_bytes().to_vec(),
    });
    let sessions = login_all(&url, &options, args.threads).await?;
    let first = sessions.first().context("no session")?;
    let (lun_blocks, bs) = first.read_capacity16().await.context("READ CAPACITY")?;
    let bs = bs as usize;
    let region = match &args.size {
        Some(s) => {
            let bytes = parse_size(s)?;
            let blocks = bytes / bs as u64;
            if blocks > lun_blocks {
                bail!(
                    "--size {s} is larger than the LUN ({} bytes)",
                    lun_blocks * bs as u64
                );
            }
            blocks
        }
        None => lun_blocks,
    };
    let oracle = args
        .verify
        .then(|| Oracle::new(region, bs))
        .transpose()?
        .map(Arc::new);
    if let Some(oracle) = oracle
        .as_ref()
        .filter(|_| patterns.iter().any(|p| p.read_percent > 0))
    {
        // Every block of the region carries its LBA before anything is read.
        let parts = slices(region, sessions.len(), 1)?;
        let mut fills = Vec::new();
        for (s, (start, blocks)) in sessions.iter().zip(parts) {
            fills.push(tokio::spawn(prefill(
                s.clone(),
                oracle.clone(),
                start,
                blocks,
                bs,
            )));
        }
        for f in fills {
            f.await.context("prefill task")??;
        }
    }
    print_header();
    let mut outcomes = Vec::new();
    for p in patterns {
        let o = run_pattern(&sessions, p, &args, region, bs, duration, oracle.as_ref()).await?;
        print_row(&o);
        outcomes.push(o);
    }
    for s in sessions {
        if let Ok(s) = Arc::try_unwrap(s) {
            let _ = s.logout().await;
        }
    }
    let verify_errors: u64 = outcomes.iter().map(|o| o.merged.verify_errors).sum();
    if let Some(path) = &args.json {
        let doc = json!({
            "target": format!("iscsi://{}/{}/{}", url.portal(), url.target, url.lun),
            "threads": args.threads,
            "depth": args.depth,
            "duration_s": duration.as_secs_f64(),
            "region_bytes": region * bs as u64,
            "block_size": bs,
            "verify": args.verify,
            "results": outcomes.iter().map(Outcome::json).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if verify_errors > 0 {
        bail!("{verify_errors} blocks failed verification");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_monotonic_and_precise() {
        let mut last = 0;
        for i in 1..BUCKETS {
            let v = Histogram::value(i);
            assert!(v > last, "bucket {i}");
            assert_eq!(Histogram::index(v), i);
            last = v;
        }
        let mut h = Histogram::new();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p99 = h.quantile_ns(0.99) as f64;
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.04, "{p99}");
        assert!((h.mean_ns() - 500_500.0).abs() < 1.0);
    }

    #[test]
    fn verification_blocks() {
        let mut b = vec![0u8; 4096];
        fill_verified(&mut b, 100, 512, 7);
        let any = |_| 0;
        assert_eq!(count_bad_blocks(&b, 100, 512, any), 0);
        assert_eq!(count_bad_blocks(&b, 100, 512, |_| 7), 0);
        // An older version of the blocks (stale stamp) is caught.
        assert_eq!(
            count_bad_blocks(&b, 100, 512, |l| if l < 102 { 8 } else { 7 }),
            2
        );
        assert_eq!(count_bad_blocks(&b, 101, 512, any), 8);
        b[600] ^= 1;
        assert_eq!(count_bad_blocks(&b, 100, 512, any), 1);
        assert_eq!(count_bad_blocks(&[0u8; 1024], 5, 512, any), 0);
    }

    #[test]
    fn oracle_tracks_grains() {
        let o = Oracle::new(1000, 512).unwrap();
        assert_eq!(o.expected(17), 0);
        o.record(16, 16, 9);
        assert_eq!(
            (
                o.expected(15),
                o.expected(16),
                o.expected(31),
                o.expected(32)
            ),
            (0, 9, 9, 0)
        );
        o.record(990, 10, 4);
        assert_eq!(o.expected(999), 4);
        assert!(Oracle::new(u64::MAX / 2, 512).is_err());
    }

    #[test]
    fn parses_options() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("x").is_err());
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert!(parse_size("12Q").is_err());
        assert!(pattern("4k-randread").is_ok());
        assert!(pattern("5k").is_err());
    }
}
