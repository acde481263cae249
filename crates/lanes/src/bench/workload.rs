//! What every target driver shares: a pattern cut into per-task slices, the sequence of I/Os
//! each task issues, what a task measured, and a pattern's outcome as a table row and JSON.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use serde_json::{json, Value};

use super::histogram::Histogram;
use super::meter::{Counters, CpuTimes};
use super::pattern::Pattern;
use super::verify::Oracle;

/// How one pattern is run: threads x depth tasks, each on its own slice of the region.
pub struct Plan {
    pub pattern: Pattern,
    pub threads: usize,
    pub depth: usize,
    /// First block and number of blocks of each task's slice.
    pub slices: Vec<(u64, u64)>,
    pub block_size: usize,
}

impl Plan {
    pub fn new(
        pattern: Pattern,
        threads: usize,
        depth: usize,
        region_blocks: u64,
        block_size: usize,
    ) -> anyhow::Result<Plan> {
        let (threads, depth) = if pattern.qd1 {
            (1, 1)
        } else {
            (threads, depth)
        };
        let per_io = (pattern.block / block_size).max(1) as u64;
        Ok(Plan {
            pattern,
            threads,
            depth,
            slices: slices(region_blocks, threads * depth, per_io)?,
            block_size,
        })
    }

    /// The job of task `i`; tasks of one pattern share `stop`, the oracle and the counters.
    pub fn job(
        &self,
        i: usize,
        oracle: Option<&Arc<Oracle>>,
        stop: &Arc<AtomicBool>,
        counters: &Counters,
    ) -> Job {
        let (start, blocks) = self.slices.get(i).copied().unwrap_or((0, 0));
        Job {
            pattern: self.pattern,
            start,
            blocks,
            block_size: self.block_size,
            seed: 0x1234_5678 ^ ((i as u64 + 1) << 20) ^ u64::from(std::process::id()),
            oracle: oracle.cloned(),
            stop: stop.clone(),
            counters: counters.clone(),
            index: i,
        }
    }
}

/// Cuts `region` blocks into `n` aligned slices of whole I/Os.
pub fn slices(region: u64, n: usize, per_io: u64) -> anyhow::Result<Vec<(u64, u64)>> {
    let per = region / n as u64 / per_io * per_io;
    if per == 0 {
        bail!(
            "the tested region is too small for {n} tasks of this block size; use a larger --size"
        );
    }
    Ok((0..n as u64).map(|i| (i * per, per)).collect())
}

/// One task's share of a pattern.
pub struct Job {
    pub pattern: Pattern,
    pub start: u64,
    pub blocks: u64,
    pub block_size: usize,
    pub seed: u64,
    /// Present with --verify.
    pub oracle: Option<Arc<Oracle>>,
    pub stop: Arc<AtomicBool>,
    pub counters: Counters,
    /// This task's counter in `counters`.
    pub index: usize,
}

/// One I/O: where, and whether it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Io {
    pub lba: u64,
    pub read: bool,
}

/// The I/Os of one task: sequential patterns stream through the slice and wrap, random ones
/// pick I/O-aligned offsets in it; the read/write mix is drawn per I/O.
pub struct IoStream {
    rng: u64,
    cursor: u64,
    slots: u64,
    per_io: u64,
    start: u64,
    read_percent: u64,
    random: bool,
}

impl IoStream {
    pub fn new(job: &Job) -> IoStream {
        let per_io = (job.pattern.block / job.block_size).max(1) as u64;
        IoStream {
            rng: job.seed | 1,
            cursor: 0,
            slots: (job.blocks / per_io).max(1),
            per_io,
            start: job.start,
            read_percent: job.pattern.read_percent,
            random: job.pattern.random,
        }
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64: fast, and good enough to spread offsets and mix reads with writes.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    pub fn next_io(&mut self) -> Io {
        let slot = if self.random {
            self.next_random() % self.slots
        } else {
            let s = self.cursor;
            self.cursor = (self.cursor + 1) % self.slots;
            s
        };
        let read = self.next_random() % 100 < self.read_percent;
        Io {
            lba: self.start + slot * self.per_io,
            read,
        }
    }

    /// A stamp for a verified write: the top bit set, never 0 (unknown) or the prefill's.
    pub fn stamp(&mut self) -> u64 {
        self.next_random() | 1 << 63
    }

    pub fn blocks_per_io(&self) -> u64 {
        self.per_io
    }
}

/// What one task (or, merged, a whole pattern) measured.
pub struct TaskResult {
    pub hist: Histogram,
    pub reads: u64,
    pub writes: u64,
    pub bytes: u64,
    pub verify_errors: u64,
}

impl TaskResult {
    pub fn new() -> TaskResult {
        TaskResult {
            hist: Histogram::new(),
            reads: 0,
            writes: 0,
            bytes: 0,
            verify_errors: 0,
        }
    }

    /// Accounts one finished I/O that took `latency`.
    pub fn record(&mut self, job: &Job, read: bool, latency: Duration) {
        self.hist.record(latency);
        if read {
            self.reads += 1;
        } else {
            self.writes += 1;
        }
        self.bytes += job.pattern.block as u64;
        if let Some(c) = job.counters.get(job.index) {
            c.set(self.bytes);
        }
    }

    pub fn merge(&mut self, other: &TaskResult) {
        self.hist.merge(&other.hist);
        self.reads += other.reads;
        self.writes += other.writes;
        self.bytes += other.bytes;
        self.verify_errors += other.verify_errors;
    }
}

/// One pattern's result.
pub struct Outcome {
    pub pattern: Pattern,
    pub threads: usize,
    pub depth: usize,
    pub seconds: f64,
    pub merged: TaskResult,
    pub cpu: CpuTimes,
}

impl Outcome {
    pub fn new(plan: &Plan, elapsed: Duration, merged: TaskResult, cpu: CpuTimes) -> Outcome {
        Outcome {
            pattern: plan.pattern,
            threads: plan.threads,
            depth: plan.depth,
            seconds: elapsed.as_secs_f64().max(1e-9),
            merged,
            cpu,
        }
    }

    fn ios(&self) -> u64 {
        self.merged.reads + self.merged.writes
    }

    pub fn iops(&self) -> f64 {
        self.ios() as f64 / self.seconds
    }

    pub fn mb_per_s(&self) -> f64 {
        self.merged.bytes as f64 / self.seconds / 1e6
    }

    /// CPU time of the whole process over the pattern's wall time, in % of one core.
    pub fn cpu_percent(&self) -> f64 {
        100.0 * self.cpu.total_s() / self.seconds
    }

    pub fn json(&self) -> Value {
        let h = &self.merged.hist;
        let per_io = |s: f64| {
            if self.ios() == 0 {
                Value::Null
            } else {
                json!(s * 1e6 / self.ios() as f64)
            }
        };
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
            "lat_p50_us": h.quantile_ns(0.5) as f64 / 1e3,
            "lat_p99_us": h.quantile_ns(0.99) as f64 / 1e3,
            "lat_max_us": h.max_ns as f64 / 1e3,
            "cpu_user_s": self.cpu.user_s,
            "cpu_sys_s": self.cpu.sys_s,
            "cpu_percent": self.cpu_percent(),
            "cpu_us_per_io": per_io(self.cpu.total_s()),
            "verify_errors": self.merged.verify_errors,
        })
    }
}

pub fn print_header() {
    println!(
        "{:<16} {:>7} {:>5} {:>10} {:>9} {:>10} {:>10} {:>6} {:>7}",
        "pattern", "threads", "depth", "IOPS", "MB/s", "avg lat", "p99 lat", "CPU", "errors"
    );
}

pub fn print_row(o: &Outcome) {
    let h = &o.merged.hist;
    let ms = |ns: f64| format!("{:.3} ms", ns / 1e6);
    println!(
        "{:<16} {:>7} {:>5} {:>10.0} {:>9.1} {:>10} {:>10} {:>5.0}% {:>7}",
        o.pattern.name,
        o.threads,
        o.depth,
        o.iops(),
        o.mb_per_s(),
        ms(h.mean_ns()),
        ms(h.quantile_ns(0.99) as f64),
        o.cpu_percent(),
        o.merged.verify_errors
    );
}

#[cfg(test)]
mod tests {
    use super::super::meter::counters;
    use super::super::pattern::pattern;
    use super::*;

    #[test]
    fn streams_stay_in_their_slice() {
        for name in ["4k-randread", "8k-seqrw-67", "1m-seqread-qd1"] {
            let p = pattern(name).unwrap();
            let plan = Plan::new(p, 2, 3, 100_000, 512).unwrap();
            assert_eq!(plan.slices.len(), if p.qd1 { 1 } else { 6 });
            let stop = Arc::new(AtomicBool::new(false));
            let c = counters(plan.slices.len());
            let mut reads = 0;
            for i in 0..plan.slices.len() {
                let job = plan.job(i, None, &stop, &c);
                let mut s = IoStream::new(&job);
                for _ in 0..1000 {
                    let io = s.next_io();
                    assert!(io.lba >= job.start, "{name}");
                    assert!(
                        io.lba + s.blocks_per_io() <= job.start + job.blocks,
                        "{name}"
                    );
                    assert_eq!((io.lba - job.start) % s.blocks_per_io(), 0);
                    reads += u64::from(io.read);
                }
            }
            let share = reads as f64 / (1000.0 * plan.slices.len() as f64);
            assert!(
                (share - p.read_percent as f64 / 100.0).abs() < 0.05,
                "{name}"
            );
        }
        assert!(Plan::new(pattern("1m-seqread-qd1").unwrap(), 8, 8, 1000, 512).is_err());
    }

    #[test]
    fn sequential_streams_advance_by_one_io() {
        let p = pattern("64k-seqread").unwrap();
        let plan = Plan::new(p, 1, 1, 1024, 512).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let job = plan.job(0, None, &stop, &counters(1));
        let mut s = IoStream::new(&job);
        let lbas: Vec<u64> = (0..10).map(|_| s.next_io().lba).collect();
        assert_eq!(lbas, [0, 128, 256, 384, 512, 640, 768, 896, 0, 128]);
    }
}
