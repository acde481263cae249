//! The iSCSI driver: threads are OS threads, each with its own session through `lanes-initiator`
//! and `depth` tokio tasks with one command outstanding each.
//!
//! Each thread logs in with its own ISID (one TCP connection, one CmdSN window), as DiskSpd
//! threads on an MPIO host end up spread over sessions, so the target sees threads x depth
//! commands in flight.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::{Bytes, BytesMut};
use lanes_initiator::{ChapSecret, IscsiUrl, LoginOptions, Session};
use tokio::sync::{mpsc, oneshot};

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
    // One clock read per I/O: an I/O's end is the next one's start (what lies between, picking
    // the next offset, is part of issuing it), except after --verify's checks.
    let mut began = Instant::now();
    while !job.stop.load(Ordering::Relaxed) {
        let io = stream.next_io();
        let lba = io.lba;
        let mut stamp = 0;
        let data = if io.read {
            session
                .read(lba, per_io as u32)
                .await
                .with_context(|| format!("read at LBA {lba}"))?
        } else {
            stamp = stream.stamp();
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
            Bytes::new()
        };
        let done = Instant::now();
        result.record(&job, io.read, done.saturating_duration_since(began));
        began = done;
        if let Some(oracle) = &job.oracle {
            if io.read {
                result.verify_errors +=
                    count_bad_blocks(&data, lba, job.block_size, |l| oracle.expected(l));
            } else {
                oracle.record(lba, per_io, stamp);
            }
            began = Instant::now();
        }
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

/// What the coordinator asks a bench thread to do.
enum Order {
    /// Run these jobs as tasks until their stop flag is set; answer with what each measured.
    Run {
        jobs: Vec<Job>,
        reply: oneshot::Sender<anyhow::Result<Vec<TaskResult>>>,
    },
    /// Stamp `blocks` blocks from `start` for `--verify`.
    Prefill {
        oracle: Arc<Oracle>,
        start: u64,
        blocks: u64,
        reply: oneshot::Sender<anyhow::Result<()>>,
    },
}

/// One bench thread: an OS thread with a current-thread tokio runtime that owns one session,
/// its reader and writer tasks and the thread's `depth` I/O tasks, as a DiskSpd thread owns
/// its I/Os. Nothing of it wakes another thread per I/O (with one multi-threaded runtime,
/// about one context switch per 128 KiB read went to cross-thread wake-ups).
struct BenchThread {
    orders: mpsc::UnboundedSender<Order>,
    done: oneshot::Receiver<()>,
}

/// Where a session is and who logs in.
#[derive(Clone)]
struct Login {
    portal: SocketAddr,
    target: String,
    options: LoginOptions,
}

impl BenchThread {
    /// Starts the thread and logs in; answers the LUN's (blocks, block size).
    async fn start(index: usize, login: Login) -> anyhow::Result<(BenchThread, u64, u32)> {
        let (orders, mut inbox) = mpsc::unbounded_channel::<Order>();
        let (ready_tx, ready) = oneshot::channel::<anyhow::Result<(u64, u32)>>();
        let (done_tx, done) = oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("bench thread runtime")?;
        std::thread::Builder::new()
            .name(format!("bench-{index}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let session = match open_session(&login).await {
                        Ok((s, blocks, bs)) => {
                            let _ = ready_tx.send(Ok((blocks, bs)));
                            Arc::new(s)
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    while let Some(order) = inbox.recv().await {
                        serve_order(&session, order).await;
                    }
                    if let Ok(s) = Arc::try_unwrap(session) {
                        let _ = s.logout().await;
                    }
                });
                let _ = done_tx.send(());
            })
            .context("starting a bench thread")?;
        let (blocks, bs) = ready.await.context("a bench thread ended during login")??;
        Ok((BenchThread { orders, done }, blocks, bs))
    }

    fn order(&self, order: Order) -> anyhow::Result<()> {
        self.orders
            .send(order)
            .map_err(|_| anyhow::anyhow!("a bench thread has ended"))
    }

    /// Logs out and waits for the thread to end.
    async fn finish(self) {
        drop(self.orders);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.done).await;
    }
}

async fn open_session(login: &Login) -> anyhow::Result<(Session, u64, u32)> {
    let s = Session::login(login.portal, &login.target, &login.options)
        .await
        .with_context(|| format!("login to {} at {}", login.target, login.portal))?;
    s.test_unit_ready().await.context("TEST UNIT READY")?;
    let (blocks, bs) = s.read_capacity16().await.context("READ CAPACITY")?;
    Ok((s, blocks, bs))
}

async fn serve_order(session: &Arc<Session>, order: Order) {
    match order {
        Order::Run { jobs, reply } => {
            let tasks: Vec<_> = jobs
                .into_iter()
                .map(|job| {
                    let stop = job.stop.clone();
                    let task = tokio::spawn(run_task(session.clone(), job));
                    (stop, task)
                })
                .collect();
            let mut results = Vec::with_capacity(tasks.len());
            let mut first_error = None;
            for (stop, task) in tasks {
                match task.await {
                    Ok(Ok(r)) => results.push(r),
                    Ok(Err(e)) => {
                        // One failed I/O ends the pattern for every task, at once.
                        stop.store(true, Ordering::Relaxed);
                        first_error.get_or_insert(e);
                    }
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        first_error.get_or_insert(anyhow::anyhow!("benchmark task failed: {e}"));
                    }
                }
            }
            let _ = reply.send(match first_error {
                Some(e) => Err(e),
                None => Ok(results),
            });
        }
        Order::Prefill {
            oracle,
            start,
            blocks,
            reply,
        } => {
            let bs = session.block_size() as usize;
            let _ = reply.send(prefill(session.clone(), oracle, start, blocks, bs).await);
        }
    }
}

async fn start_threads(
    url: &IscsiUrl,
    options: &LoginOptions,
    n: usize,
) -> anyhow::Result<(Vec<BenchThread>, u64, u32)> {
    let portal = lanes_initiator::resolve(&url.portal()).await?;
    let mut threads = Vec::with_capacity(n);
    let mut capacity = (0, 0);
    for i in 0..n {
        let mut o = options.clone();
        o.isid = lanes_initiator::random_isid();
        let login = Login {
            portal,
            target: url.target.clone(),
            options: o,
        };
        match BenchThread::start(i, login).await {
            Ok((t, blocks, bs)) => {
                capacity = (blocks, bs);
                threads.push(t);
            }
            Err(e) => {
                for t in threads {
                    t.finish().await;
                }
                return Err(e);
            }
        }
    }
    Ok((threads, capacity.0, capacity.1))
}

async fn run_pattern(
    threads: &[BenchThread],
    plan: &Plan,
    duration: Duration,
    oracle: Option<&Arc<Oracle>>,
) -> anyhow::Result<Outcome> {
    let stop = Arc::new(AtomicBool::new(false));
    let counters = counters(plan.slices.len());
    let cpu0 = CpuTimes::now();
    let began = Instant::now();
    let mut replies = Vec::with_capacity(plan.threads);
    for (t, thread) in threads.iter().take(plan.threads).enumerate() {
        let jobs = (t * plan.depth..(t + 1) * plan.depth)
            .map(|i| plan.job(i, oracle, &stop, &counters))
            .collect();
        let (reply, rx) = oneshot::channel();
        thread.order(Order::Run { jobs, reply })?;
        replies.push(rx);
    }
    let mut progress = Progress::start(plan.pattern.name, duration, counters);
    let deadline = began + duration;
    loop {
        let now = Instant::now();
        // The stop flag is only set early by a failed I/O: end then, not at the deadline.
        if now >= deadline || stop.load(Ordering::Relaxed) {
            break;
        }
        tokio::time::sleep(TICK.min(deadline - now)).await;
        progress.tick(began, duration);
    }
    stop.store(true, Ordering::Relaxed);
    let mut merged = TaskResult::new();
    let mut first_error = None;
    for rx in replies {
        match rx.await {
            Ok(Ok(results)) => results.iter().for_each(|r| merged.merge(r)),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(anyhow::anyhow!("a bench thread ended unexpectedly"));
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
    let (threads, lun_blocks, bs) = start_threads(&url, &options, settings.threads).await?;
    let result = measure(&url, &threads, lun_blocks, bs as usize, settings).await;
    for t in threads {
        t.finish().await;
    }
    result
}

async fn measure(
    url: &IscsiUrl,
    threads: &[BenchThread],
    lun_blocks: u64,
    bs: usize,
    settings: &Settings,
) -> anyhow::Result<Report> {
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
        let parts = slices(region, threads.len(), 1)?;
        let mut fills = Vec::new();
        for (t, (start, blocks)) in threads.iter().zip(parts) {
            let (reply, rx) = oneshot::channel();
            t.order(Order::Prefill {
                oracle: oracle.clone(),
                start,
                blocks,
                reply,
            })?;
            fills.push(rx);
        }
        for f in fills {
            f.await.context("a bench thread ended during prefill")??;
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
        let o = run_pattern(threads, &plan, settings.duration, oracle.as_ref()).await?;
        print_row(&o);
        report.outcomes.push(o);
    }
    Ok(report)
}
