//! The measuring half of `lanes bench smb://`: one session with N channels (bound to the
//! interfaces the server reports, or to addresses the user names), a test file on the share,
//! and patterns run for a fixed time with a queue depth of I/Os in flight, spread over the
//! channels. Printing belongs to the caller.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::SmbError;
use crate::file::{File, OpenOptions};
use crate::session::{ChannelInfo, ClientConfig, Session};
use crate::url::SmbUrl;

/// The patterns run when none are named.
pub const DEFAULT_PATTERNS: &[&str] = &["1m-seqread", "1m-seqwrite", "4k-randread", "4k-randwrite"];

/// `<size>-<seq|rand><read|write>`, e.g. `1m-seqread`, `4k-randwrite`, `64k-seqwrite`, or
/// `<size>-verify`: each I/O slot writes its own blocks in turn, every sector stamped with
/// block, version and sector, and reads each back at once; a read that is not the write just
/// acknowledged ends the run with an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchPattern {
    pub name: String,
    pub block: u32,
    pub write: bool,
    pub random: bool,
    pub verify: bool,
}

impl BenchPattern {
    pub fn parse(name: &str) -> Result<BenchPattern, SmbError> {
        let bad = || {
            SmbError::Usage(format!(
                "pattern '{name}': want SIZE-seqread, SIZE-seqwrite, SIZE-randread, SIZE-randwrite or SIZE-verify (e.g. 1m-seqread, 4k-randwrite)"
            ))
        };
        let (size, kind) = name.split_once('-').ok_or_else(bad)?;
        let (digits, unit) = size.split_at(size.len().saturating_sub(1));
        let scale = match unit {
            "k" | "K" => 1024,
            "m" | "M" => 1024 * 1024,
            _ => return Err(bad()),
        };
        let block = digits
            .parse::<u32>()
            .ok()
            .and_then(|n| n.checked_mul(scale))
            .filter(|b| (512..=8 * 1024 * 1024).contains(b))
            .ok_or_else(bad)?;
        let (random, write, verify) = match kind {
            "seqread" => (false, false, false),
            "seqwrite" => (false, true, false),
            "randread" => (true, false, false),
            "randwrite" => (true, true, false),
            "verify" => (false, true, true),
            _ => return Err(bad()),
        };
        Ok(BenchPattern {
            name: name.to_string(),
            block,
            write,
            random,
            verify,
        })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub url: SmbUrl,
    pub password: String,
    /// Channels of the session, the first one included; 0: one per address (given or
    /// advertised).
    pub channels: usize,
    /// Addresses to bind channels to; empty: the interfaces the server reports.
    pub addresses: Vec<IpAddr>,
    pub encrypt: bool,
    pub patterns: Vec<BenchPattern>,
    pub duration: Duration,
    /// Size of the test file.
    pub size: u64,
    /// I/Os in flight at once.
    pub queue_depth: usize,
    /// The process's CPU seconds so far (user + system), for CPU per GB.
    pub cpu_seconds: fn() -> f64,
    /// How long a channel may stay silent with requests waiting before the session gives it
    /// up and sends them on the others (None: the client's default).
    pub channel_timeout: Option<Duration>,
}

/// The width of one bin of a pattern's timeline.
pub const TIMELINE_BIN: Duration = Duration::from_millis(100);

/// Bytes one channel carried during a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelBytes {
    pub server: SocketAddr,
    pub client: SocketAddr,
    pub bytes: u64,
}

#[derive(Debug, Clone)]
pub struct PatternResult {
    pub pattern: BenchPattern,
    pub queue_depth: usize,
    pub seconds: f64,
    pub ios: u64,
    pub bytes: u64,
    pub cpu_seconds: f64,
    pub channels: Vec<ChannelBytes>,
    /// The slowest single I/O.
    pub longest_io: Duration,
    /// Bytes completed in each TIMELINE_BIN from the start.
    pub timeline: Vec<u64>,
}

impl PatternResult {
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9) / 1e6
    }
    pub fn iops(&self) -> f64 {
        self.ios as f64 / self.seconds.max(1e-9)
    }
    /// CPU seconds of this process per GB moved.
    pub fn cpu_s_per_gb(&self) -> f64 {
        if self.bytes == 0 {
            return 0.0;
        }
        self.cpu_seconds / (self.bytes as f64 / 1e9)
    }
}

#[derive(Debug, Clone)]
pub struct BenchReport {
    pub server: SocketAddr,
    pub signing: String,
    pub cipher: Option<String>,
    pub encrypted: bool,
    pub channels: Vec<ChannelInfo>,
    /// Channels that could not be bound, with the reason.
    pub bind_failures: Vec<(SocketAddr, String)>,
    pub file_size: u64,
    pub results: Vec<PatternResult>,
    /// Channels the session gave up during the run, and how many it bound again.
    pub channels_lost: u64,
    pub channels_rebound: u64,
}

/// The addresses channel 2..N go to: the user's list, or the server's interfaces fastest
/// first (same address family as the first channel), the first channel's address included,
/// taken in turn.
async fn channel_targets(
    tree: &crate::file::Tree,
    primary: SocketAddr,
    opts: &BenchOptions,
) -> Vec<SocketAddr> {
    let mut ips: Vec<IpAddr> = if opts.addresses.is_empty() {
        let mut list = tree.network_interfaces().await.unwrap_or_default();
        list.sort_by_key(|n| std::cmp::Reverse(n.link_speed));
        let mut ips = vec![primary.ip()];
        ips.extend(
            list.iter()
                .map(|n| n.address)
                .filter(|a| a.is_ipv4() == primary.is_ipv4()),
        );
        ips
    } else {
        opts.addresses.clone()
    };
    let mut seen = Vec::new();
    ips.retain(|ip| {
        let new = !seen.contains(ip);
        seen.push(*ip);
        new
    });
    let channels = if opts.channels == 0 {
        ips.len().min(32)
    } else {
        opts.channels
    };
    (1..channels)
        .filter_map(|i| ips.get(i % ips.len().max(1)).copied())
        .map(|ip| SocketAddr::new(ip, primary.port()))
        .collect()
}

/// Connects, binds the channels, prepares the test file and runs every pattern.
pub async fn run(
    opts: &BenchOptions,
    mut progress: impl FnMut(&str),
) -> Result<BenchReport, SmbError> {
    if opts.channels > 32 || opts.queue_depth == 0 {
        return Err(SmbError::Usage(
            "channels must be at most 32 and the queue depth at least 1".into(),
        ));
    }
    let primary = opts.url.addr()?;
    let mut cfg = ClientConfig::new(&opts.url.user, &opts.password);
    cfg.domain = opts.url.domain.clone();
    cfg.encrypt = opts.encrypt;
    if opts.channel_timeout.is_some() {
        cfg.channel_timeout = opts.channel_timeout;
    }
    let session = Session::connect(primary, cfg).await?;
    let tree = session
        .tree_connect(&opts.url.host, &opts.url.share)
        .await?;
    let mut bind_failures = Vec::new();
    for addr in channel_targets(&tree, primary, opts).await {
        match session.bind_channel(addr).await {
            Ok(c) => progress(&format!("channel bound: {} -> {}", c.client, c.server)),
            Err(e) => bind_failures.push((addr, e.to_string())),
        }
    }
    let path = if opts.url.path.is_empty() {
        "lanes-bench.dat".to_string()
    } else {
        opts.url.path.clone()
    };
    let file = tree.open(&path, OpenOptions::READ_WRITE).await?;
    let data: Arc<Vec<u8>> = Arc::new(pseudo_random(8 * 1024 * 1024, 0x1a7e5));
    let block = opts
        .patterns
        .iter()
        .map(|p| p.block)
        .max()
        .unwrap_or(1 << 20);
    let size = opts.size / u64::from(block) * u64::from(block);
    if size == 0 {
        return Err(SmbError::Usage(
            "--size is smaller than the largest block".into(),
        ));
    }
    if file.end_of_file < size {
        progress(&format!("writing the {size}-byte test file {path}"));
        fill(&file, size, &data, opts.queue_depth).await?;
    }
    let mut results = Vec::new();
    for p in &opts.patterns {
        progress(&format!("running {} for {:?}", p.name, opts.duration));
        results.push(run_pattern(&session, &file, p, size, &data, opts).await?);
    }
    file.close().await?;
    let neg = session.negotiated();
    let (channels_lost, channels_rebound) = session.failovers();
    Ok(BenchReport {
        server: primary,
        signing: format!("{:?}", neg.signing),
        cipher: neg.cipher.map(|c| format!("{c:?}")),
        encrypted: session.encrypted(),
        channels: session.channels(),
        bind_failures,
        file_size: size,
        results,
        channels_lost,
        channels_rebound,
    })
}

async fn fill(file: &File, size: u64, data: &Arc<Vec<u8>>, depth: usize) -> Result<(), SmbError> {
    const CHUNK: u64 = 1 << 20;
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..depth.min(16) {
        let (f, d, next) = (file.clone(), data.clone(), next.clone());
        tasks.spawn(async move {
            loop {
                let off = next.fetch_add(CHUNK, std::sync::atomic::Ordering::Relaxed);
                if off >= size {
                    return Ok::<(), SmbError>(());
                }
                let len = CHUNK.min(size - off) as usize;
                let at = (off as usize) % (d.len() - len + 1);
                f.write_at(off, d.get(at..at + len).unwrap_or(&[])).await?;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| SmbError::Usage(format!("fill task: {e}")))??;
    }
    file.flush().await
}

async fn run_pattern(
    session: &Session,
    file: &File,
    p: &BenchPattern,
    size: u64,
    data: &Arc<Vec<u8>>,
    opts: &BenchOptions,
) -> Result<PatternResult, SmbError> {
    let before = session.channels();
    let cpu0 = (opts.cpu_seconds)();
    let started = tokio::time::Instant::now();
    let deadline = started + opts.duration;
    let blocks = size / u64::from(p.block);
    let depth = opts.queue_depth;
    let bins = (opts.duration.as_millis() / TIMELINE_BIN.as_millis()) as usize + 600;
    let meter = Arc::new(Meter {
        started,
        timeline: (0..bins).map(|_| AtomicU64::new(0)).collect(),
        longest_us: AtomicU64::new(0),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..depth {
        let (f, d, p, meter) = (file.clone(), data.clone(), p.clone(), meter.clone());
        // Sequential streams each walk their own slice; random ones roam the whole file.
        let slice = (blocks / depth as u64).max(1);
        let first = (t as u64 * slice) % blocks.max(1);
        tasks.spawn(async move {
            let mut rng =
                0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let (mut ios, mut bytes, mut k) = (0u64, 0u64, 0u64);
            let mut stamped = if p.verify {
                vec![0u8; p.block as usize]
            } else {
                Vec::new()
            };
            while tokio::time::Instant::now() < deadline {
                let index = if p.random {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng % blocks
                } else {
                    (first + k % slice) % blocks
                };
                k += 1;
                let off = index * u64::from(p.block);
                let t0 = tokio::time::Instant::now();
                let n = if p.verify {
                    stamp(&mut stamped, index, k);
                    let n = f.write_at(off, &stamped).await? as u64;
                    meter.done(t0, n);
                    ios += 1;
                    bytes += n;
                    let t1 = tokio::time::Instant::now();
                    let back = f.read_at(off, p.block).await?;
                    if back[..] != stamped[..] {
                        return Err(SmbError::Verify(mismatch(&back, &stamped, index, off)));
                    }
                    meter.done(t1, back.len() as u64);
                    back.len() as u64
                } else if p.write {
                    let len = p.block as usize;
                    let at = (off as usize) % (d.len() - len + 1);
                    let n = f.write_at(off, d.get(at..at + len).unwrap_or(&[])).await? as u64;
                    meter.done(t0, n);
                    n
                } else {
                    let n = f.read_at(off, p.block).await?.len() as u64;
                    meter.done(t0, n);
                    n
                };
                ios += 1;
                bytes += n;
            }
            Ok::<(u64, u64), SmbError>((ios, bytes))
        });
    }
    let (mut ios, mut bytes) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        let (i, b) = r.map_err(|e| SmbError::Usage(format!("bench task: {e}")))??;
        ios += i;
        bytes += b;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = ((opts.cpu_seconds)() - cpu0).max(0.0);
    let after = session.channels();
    let channels = after
        .iter()
        .map(|a| {
            let b = before.iter().find(|b| b.client == a.client);
            let moved = |c: &ChannelInfo| c.bytes_read + c.bytes_written;
            ChannelBytes {
                server: a.server,
                client: a.client,
                bytes: moved(a) - b.map_or(0, moved),
            }
        })
        .collect();
    Ok(PatternResult {
        pattern: p.clone(),
        queue_depth: depth,
        seconds,
        ios,
        bytes,
        cpu_seconds,
        channels,
        longest_io: Duration::from_micros(meter.longest_us.load(Ordering::Relaxed)),
        timeline: {
            let mut t: Vec<u64> = meter
                .timeline
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect();
            while t.last() == Some(&0) {
                t.pop();
            }
            t
        },
    })
}

/// Completions of a pattern: bytes per timeline bin and the slowest I/O.
struct Meter {
    started: tokio::time::Instant,
    timeline: Vec<AtomicU64>,
    longest_us: AtomicU64,
}

impl Meter {
    fn done(&self, issued: tokio::time::Instant, bytes: u64) {
        let now = tokio::time::Instant::now();
        self.longest_us.fetch_max(
            now.duration_since(issued).as_micros() as u64,
            Ordering::Relaxed,
        );
        let bin =
            (now.duration_since(self.started).as_millis() / TIMELINE_BIN.as_millis()) as usize;
        if let Some(b) = self.timeline.get(bin).or(self.timeline.last()) {
            b.fetch_add(bytes, Ordering::Relaxed);
        }
    }
}

/// Fills `buf` for block `index` at `version`: every 512-byte sector names block, version and
/// sector, so a stale, torn or misplaced block shows.
fn stamp(buf: &mut [u8], index: u64, version: u64) {
    for (i, sector) in buf.chunks_mut(512).enumerate() {
        for (j, word) in sector.chunks_mut(8).enumerate() {
            let v = match j % 3 {
                0 => index,
                1 => version,
                _ => i as u64,
            };
            let bytes = v.to_le_bytes();
            word.copy_from_slice(bytes.get(..word.len()).unwrap_or(&bytes));
        }
    }
}

/// What a read-back that differs from its write holds, sector by sector.
fn mismatch(back: &[u8], want: &[u8], index: u64, off: u64) -> String {
    if back.len() != want.len() {
        return format!(
            "block {index} at offset {off}: read {} bytes back after writing {}",
            back.len(),
            want.len()
        );
    }
    let word = |b: &[u8], at: usize| {
        b.get(at..at + 8)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map_or(0, u64::from_le_bytes)
    };
    let bad = back
        .chunks(512)
        .zip(want.chunks(512))
        .position(|(a, b)| a != b)
        .unwrap_or(0);
    let at = bad * 512;
    format!(
        "block {index} at offset {off}: sector {bad} holds block {} version {} sector {} where \
         the write acknowledged just before put version {}",
        word(back, at),
        word(back, at + 8),
        word(back, at + 16),
        word(want, at + 8)
    )
}

fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_names() {
        let p = BenchPattern::parse("1m-seqread").unwrap();
        assert_eq!((p.block, p.write, p.random), (1 << 20, false, false));
        let p = BenchPattern::parse("4k-randwrite").unwrap();
        assert_eq!((p.block, p.write, p.random), (4096, true, true));
        assert!(!p.verify);
        let p = BenchPattern::parse("1m-verify").unwrap();
        assert!(p.verify && p.write && !p.random);
        for bad in ["1m", "1x-seqread", "0k-seqread", "16m-seqread", "4k-randrw"] {
            assert!(BenchPattern::parse(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod verify_tests {
    use super::*;

    #[test]
    fn a_stale_block_is_named_with_its_version() {
        let mut new = vec![0u8; 4096];
        let mut old = vec![0u8; 4096];
        stamp(&mut new, 7, 3);
        stamp(&mut old, 7, 2);
        assert_ne!(new, old);
        let mut torn = new.clone();
        torn[1024..1536].copy_from_slice(&old[1024..1536]);
        let m = mismatch(&torn, &new, 7, 28672);
        assert!(
            m.contains("sector 2 holds block 7 version 2 sector 2"),
            "{m}"
        );
        assert!(m.contains("put version 3"), "{m}");
    }
}
