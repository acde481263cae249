//! The iSCSI driver: threads are sessions through `lanes-initiator`, each thread runs `depth`
//! tokio tasks with one command outstanding each.
//!
//! Each thread logs in with its own ISID (one TCP connection, one CmdSN window), as DiskSpd
//! threads on an MPIO host end up spread over sessions, so the target sees threads x depth
//! commands in flight.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::{Bytes, BytesMut};
use lanes_initiator::{ChapSecret, IscsiUrl, LoginOptions, Session};

use super::meter::{counters, CpuTimes, Progress, TICK};
use super::verify::{count_bad_blocks, fill_verified, Oracle, PREFILL_STAMP};
use super::workload::{print_row, slices, IoStream, Job, Outcome, Plan, TaskResult};
use super::{Report, Settings};

async fn run_task(session: Arc<Session>, job: Job) -> anyhow::Result<TaskResult> {
    let mut result = TaskResult::new();
    let mut stream = IoStream::new(&job);
    let per_io = stream.blocks_per_io();
    // Without --verify one buffer of noise serves every write (no allocation per I/O).
    let mut noise = vec![0u8; job.pattern.block];
    fill_verified(&mut noise, 0, job.block_size, job.seed);
    let noise = Bytes::from(noise);
    while !job.stop.load(Ordering::Relaxed) {
        let io = stream.next_io();
        let lba = io.lba;
        let began = Instant::now();
        if io.read {
            let data = session
                .read(lba, per_io as u32)
                .await
                .with_context(|| format!("read at LBA {lba}"))?;
            if let Some(oracle) = &job.oracle {
                result.verify_errors +=
                    count_bad_blocks(&data, lba, job.block_size, |l| oracle.expected(l));
            }
        } else {
            let stamp = stream.stamp();
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
        }
        result.record(&job, io.read, began);
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
    plan: &Plan,
    duration: Duration,
    oracle: Option<&Arc<Oracle>>,
) -> anyhow::Result<Outcome> {
    let stop = Arc::new(AtomicBool::new(false));
    let counters = counters(plan.slices.len());
    let cpu0 = CpuTimes::now();
    let began = Instant::now();
    let mut tasks = Vec::with_capacity(plan.slices.len());
    for i in 0..plan.slices.len() {
        let session = sessions.get(i / plan.depth).context("no session")?.clone();
        let job = plan.job(i, oracle, &stop, &counters);
        tasks.push(tokio::spawn(run_task(session, job)));
    }
    let mut progress = Progress::start(plan.pattern.name, duration, counters);
    let deadline = began + duration;
    loop {
        let now = Instant::now();
        // A task only ends early on an error: stop then, not at the deadline.
        if now >= deadline || tasks.iter().any(|t| t.is_finished()) {
            break;
        }
        tokio::time::sleep(TICK.min(deadline - now)).await;
        progress.tick(began, duration);
    }
    stop.store(true, Ordering::Relaxed);
    let mut merged = TaskResult::new();
    let mut first_error = None;
    for t in tasks {
        match t.await {
            Ok(Ok(r)) => merged.merge(&r),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(anyhow::anyhow!("benchmark task failed: {e}"));
            }
        }
    }
    let elapsed = began.elapsed();
    let cpu = CpuTimes::now().since(cpu0);
    progress.finish();
    if let Some(e) = first_error {
        return Err(e.context(format!("pattern {}", plan.pattern.name)));
    }
    Ok(Outcome::new(plan, elapsed, merged, cpu))
}

pub async fn run(target: &str, settings: &Settings) -> anyhow::Result<Report> {
    let url: IscsiUrl = target.parse()?;
    let mut options = LoginOptions::new(settings.initiator_name.clone());
    options.lun = url.lun;
    options.chap = url.chap.as_ref().map(|(user, secret)| ChapSecret {
        user: user.clone(),
        secret: secret.as_bytes().to_vec(),
    });
    let sessions = login_all(&url, &options, settings.threads).await?;
    let first = sessions.first().context("no session")?;
    let (lun_blocks, bs) = first.read_capacity16().await.context("READ CAPACITY")?;
    let bs = bs as usize;
    let region = match settings.size {
        Some(bytes) => {
            let blocks = bytes / bs as u64;
            if blocks > lun_blocks {
                bail!(
                    "--size {bytes} is larger than the LUN ({} bytes)",
                    lun_blocks * bs as u64
                );
            }
            blocks
        }
        None => lun_blocks,
    };
    let oracle = settings.oracle(region, bs)?;
    if let Some(oracle) = oracle.as_ref().filter(|_| settings.reads()) {
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
    let mut report = Report::new(
        format!("iscsi://{}/{}/{}", url.portal(), url.target, url.lun),
        "iscsi",
        region * bs as u64,
        bs,
    );
    super::workload::print_header();
    for p in &settings.patterns {
        let plan = Plan::new(*p, settings.threads, settings.depth, region, bs)?;
        let o = run_pattern(&sessions, &plan, settings.duration, oracle.as_ref()).await?;
        print_row(&o);
        report.outcomes.push(o);
    }
    for s in sessions {
        if let Ok(s) = Arc::try_unwrap(s) {
            let _ = s.logout().await;
        }
    }
    Ok(report)
}
