//! The file and block-device driver: threads x depth worker threads, each with one blocking
//! `pread`/`pwrite` outstanding, on the file opened with O_DIRECT where the filesystem allows.
//!
//! What a path means: an existing block device or regular file is used as it is (from its
//! start, `--size` bytes or all of it); a path that does not exist is created with `--size`
//! bytes and written once before the patterns run, so reads read data rather than holes (fio
//! lays out its files the same way). Nothing else is ever resized.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use super::meter::{counters, CpuTimes, Progress, TICK};
use super::verify::{count_bad_blocks, fill_verified, Oracle, PREFILL_STAMP};
use super::workload::{print_header, print_row, slices, IoStream, Job, Outcome, Plan, TaskResult};
use super::{note, Report, Settings};

/// Buffer alignment for O_DIRECT: the largest logical block size in use (4 KiB).
const ALIGN: usize = 4096;
/// The "block" of a regular file: the unit `--verify` stamps, like a 512-byte-sector LUN.
const FILE_BLOCK: usize = 512;

/// A zeroed buffer whose start is aligned for O_DIRECT, without unsafe code: a slightly
/// larger `Vec` and the aligned window inside it.
struct AlignedBuf {
    raw: Vec<u8>,
    offset: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + ALIGN];
        let offset = raw.as_ptr().align_offset(ALIGN).min(ALIGN);
        AlignedBuf { raw, offset, len }
    }

    fn get(&self) -> &[u8] {
        self.raw
            .get(self.offset..self.offset + self.len)
            .unwrap_or(&[])
    }

    fn get_mut(&mut self) -> &mut [u8] {
        let range = self.offset..self.offset + self.len;
        self.raw.get_mut(range).unwrap_or(&mut [])
    }
}

/// What kind of thing the path is, and how large.
struct Target {
    file: File,
    device: bool,
    bytes: u64,
    block_size: usize,
    direct: bool,
}

fn open(path: &Path, write: bool, direct: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(write);
    if direct {
        o.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
    }
    o.open(path)
}

/// Opens with O_DIRECT, or without it where the filesystem refuses it (tmpfs, some FUSE).
fn open_direct_or_cached(path: &Path, write: bool, buffered: bool) -> anyhow::Result<(File, bool)> {
    let shown = path.display();
    if !buffered {
        match open(path, write, true) {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                note(&format!(
                    "{shown}: the filesystem refuses O_DIRECT; measuring through the page cache"
                ));
            }
            Err(e) => return Err(e).with_context(|| format!("opening '{shown}'")),
        }
    }
    let f = open(path, write, false).with_context(|| format!("opening '{shown}'"))?;
    Ok((f, false))
}

fn prepare(path: &Path, settings: &Settings, write: bool) -> anyhow::Result<(Target, bool)> {
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("'{shown}'")),
    };
    let created = meta.is_none();
    let device = meta
        .as_ref()
        .is_some_and(|m| m.file_type().is_block_device());
    match &meta {
        None => {
            let Some(size) = settings.size else {
                bail!("'{shown}' does not exist (give --size to create a file of that size)");
            };
            let f = File::create_new(path).with_context(|| format!("creating '{shown}'"))?;
            f.set_len(size)
                .with_context(|| format!("sizing '{shown}' to {size} bytes"))?;
        }
        Some(m) if m.is_dir() => bail!("'{shown}' is a directory; give a file or a block device"),
        Some(m) if !m.is_file() && !device => {
            bail!("'{shown}' is neither a regular file nor a block device")
        }
        Some(_) => {}
    }
    let (file, direct) = open_direct_or_cached(path, write || created, settings.buffered)?;
    let (bytes, block_size) = if device {
        let bytes = rustix::fs::seek(&file, rustix::fs::SeekFrom::End(0))
            .with_context(|| format!("size of '{shown}'"))?;
        let bs = rustix::fs::ioctl_blksszget(&file)
            .with_context(|| format!("logical block size of '{shown}'"))?;
        (bytes, bs as usize)
    } else {
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        (len, FILE_BLOCK)
    };
    if !(512..=ALIGN).contains(&block_size) || !block_size.is_power_of_two() {
        bail!("'{shown}': unsupported logical block size {block_size}");
    }
    let target = Target {
        file,
        device,
        bytes,
        block_size,
        direct,
    };
    Ok((target, created))
}

/// Writes `bytes` from offset `start` in 1 MiB pieces: `stamped` with verification blocks,
/// else noise.
fn lay_out(
    file: &File,
    start: u64,
    bytes: u64,
    bs: usize,
    stamped: Option<&Oracle>,
) -> anyhow::Result<()> {
    let mut buf = AlignedBuf::new(1 << 20);
    fill_verified(buf.get_mut(), 0, bs, 0x5eed);
    let mut off = start;
    while off < start + bytes {
        let n = (start + bytes - off).min(1 << 20) as usize;
        let lba = off / bs as u64;
        let piece = buf.get_mut().get_mut(..n).context("layout buffer")?;
        if let Some(oracle) = stamped {
            fill_verified(piece, lba, bs, PREFILL_STAMP);
            oracle.record(lba, (n / bs) as u64, PREFILL_STAMP);
        }
        file.write_all_at(piece, off)
            .with_context(|| format!("writing at offset {off}"))?;
        off += n as u64;
    }
    Ok(())
}

fn run_worker(file: &File, job: Job) -> anyhow::Result<TaskResult> {
    let mut result = TaskResult::new();
    let mut stream = IoStream::new(&job);
    let per_io = stream.blocks_per_io();
    let bs = job.block_size as u64;
    let mut read_buf = AlignedBuf::new(job.pattern.block);
    let mut write_buf = AlignedBuf::new(job.pattern.block);
    // Without --verify one buffer of noise serves every write.
    fill_verified(write_buf.get_mut(), 0, job.block_size, job.seed);
    // One clock read per I/O: an I/O's end is the next one's start, except after --verify's
    // checks.
    let mut began = Instant::now();
    while !job.stop.load(Ordering::Relaxed) {
        let io = stream.next_io();
        let offset = io.lba * bs;
        let mut stamp = 0;
        if io.read {
            file.read_exact_at(read_buf.get_mut(), offset)
                .with_context(|| format!("read at offset {offset}"))?;
        } else {
            if job.oracle.is_some() {
                stamp = stream.stamp();
                fill_verified(write_buf.get_mut(), io.lba, job.block_size, stamp);
            }
            file.write_all_at(write_buf.get(), offset)
                .with_context(|| format!("write at offset {offset}"))?;
        }
        let done = Instant::now();
        result.record(&job, io.read, done.saturating_duration_since(began));
        began = done;
        if let Some(oracle) = &job.oracle {
            if io.read {
                result.verify_errors +=
                    count_bad_blocks(read_buf.get(), io.lba, job.block_size, |l| {
                        oracle.expected(l)
                    });
            } else {
                oracle.record(io.lba, per_io, stamp);
            }
            began = Instant::now();
        }
    }
    Ok(result)
}

fn run_pattern(
    file: &File,
    plan: &Plan,
    duration: Duration,
    oracle: Option<&Arc<Oracle>>,
) -> anyhow::Result<Outcome> {
    let stop = Arc::new(AtomicBool::new(false));
    let counters = counters(plan.slices.len());
    let cpu0 = CpuTimes::now();
    let began = Instant::now();
    let results = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..plan.slices.len())
            .map(|i| {
                let job = plan.job(i, oracle, &stop, &counters);
                scope.spawn(move || run_worker(file, job))
            })
            .collect();
        let mut progress = Progress::start(plan.pattern.name, duration, counters.clone());
        let deadline = began + duration;
        loop {
            let now = Instant::now();
            // A worker only ends early on an error: stop then, not at the deadline.
            if now >= deadline || workers.iter().any(|w| w.is_finished()) {
                break;
            }
            std::thread::sleep(TICK.min(deadline - now));
            progress.tick(began, duration);
        }
        stop.store(true, Ordering::Relaxed);
        progress.finish();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("benchmark worker panicked")))
            })
            .collect::<Vec<_>>()
    });
    let elapsed = began.elapsed();
    let cpu = CpuTimes::now().since(cpu0);
    let mut merged = TaskResult::new();
    for r in results {
        let r = r.with_context(|| format!("pattern {}", plan.pattern.name))?;
        merged.merge(&r);
    }
    Ok(Outcome::new(plan, elapsed, merged, cpu))
}

/// Benchmarks the file or block device at `path` (blocking: run it off the async runtime).
pub fn run(path: &Path, settings: &Settings) -> anyhow::Result<Report> {
    let writes = settings.patterns.iter().any(|p| p.read_percent < 100);
    let (target, created) = prepare(path, settings, writes || settings.verify)?;
    let bs = target.block_size;
    let region_bytes = match settings.size {
        Some(size) if size > target.bytes => bail!(
            "--size {size} is larger than '{}' ({} bytes)",
            path.display(),
            target.bytes
        ),
        Some(size) => size,
        None => target.bytes,
    };
    let region = region_bytes / bs as u64;
    if region == 0 {
        bail!(
            "'{}' is empty; give a larger file, a device, or a new path with --size",
            path.display()
        );
    }
    let oracle = settings.oracle(region, bs)?;
    let stamped = oracle.as_ref().filter(|_| settings.reads());
    if stamped.is_some() || created {
        // Verified reads need every block stamped; a new file needs data, not holes. In
        // parallel, one writer per thread.
        let parts = slices(region, settings.threads, 1)?;
        std::thread::scope(|scope| {
            let fills: Vec<_> = parts
                .into_iter()
                .map(|(start, blocks)| {
                    let file = &target.file;
                    let o = stamped.map(|o| &**o);
                    scope.spawn(move || lay_out(file, start * bs as u64, blocks * bs as u64, bs, o))
                })
                .collect();
            fills
                .into_iter()
                .try_for_each(|f| f.join().unwrap_or_else(|_| bail!("layout thread panicked")))
        })
        .with_context(|| format!("preparing '{}'", path.display()))?;
        if created {
            note(&format!(
                "created '{}' ({region_bytes} bytes) and wrote it once",
                path.display()
            ));
        }
    }
    let kind = if target.device { "device" } else { "file" };
    let mut report = Report::new(path.display().to_string(), kind, region * bs as u64, bs);
    report.direct = Some(target.direct);
    print_header();
    for p in &settings.patterns {
        let plan = Plan::new(*p, settings.threads, settings.depth, region, bs)?;
        let o = run_pattern(&target.file, &plan, settings.duration, oracle.as_ref())?;
        print_row(&o);
        report.outcomes.push(o);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [4096, 8192, 1 << 20] {
            let mut b = AlignedBuf::new(len);
            assert_eq!(b.get().len(), len);
            assert_eq!(b.get().as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.get_mut().len(), len);
        }
    }
}
