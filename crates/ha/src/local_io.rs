//! The local I/O threads of one replicated LUN: its applies, resync reads and fsyncs run here,
//! never on tokio's blocking pool.
//!
//! The LUN's synchronous callers (COMPARE AND WRITE, UNMAP; READ and WRITE are asynchronous)
//! each block a thread of the blocking pool until the pair acknowledges their write, and that acknowledgement needs the LUN's local
//! apply. When the applies ran on the same pool, as many writes in flight as the pool has
//! threads took every thread, each waiting for an apply queued behind them, and the LUN never
//! moved again while both nodes stayed paired (libiscsi's SCSI.Write10.Async with the write
//! cache off: 1000 WRITEs at once against 64 blocking threads). Threads of its own make the
//! LUN's progress independent of how many callers wait on it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

/// Threads per LUN: local writes to different blocks run side by side (and one slow fsync or
/// FUA write does not stop the others). Four, not more: buffered writes to one file serialize
/// on its inode lock, and more threads only add wake-ups and lock spinning (`bench/ha-pair`,
/// 4K random writes on 2 cores: 0.56 of the single node with 8 threads, 0.64 with 4 and 0.61
/// with 2; QD1 p50 217, 184 and 172 us).
pub(crate) const THREADS: usize = 4;

pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

pub(crate) struct LocalIo {
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl LocalIo {
    /// Start `n` threads named after `name`.
    pub(crate) fn start(name: &str, n: usize) -> std::io::Result<LocalIo> {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut io = LocalIo {
            jobs: Some(tx),
            threads: Vec::with_capacity(n),
        };
        for i in 0..n.max(1) {
            let rx = rx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&rx))?;
            io.threads.push(thread);
        }
        Ok(io)
    }

    /// Queue `job`. A job that panics ends only itself (the thread goes on); jobs that must
    /// report an outcome catch their own panics (`Driver::blocking`).
    pub(crate) fn run(&self, job: Job) {
        if let Some(tx) = &self.jobs {
            // The threads end only when `jobs` is dropped, so this cannot fail.
            let _ = tx.send(job);
        }
    }

    /// Let the threads end once the queued jobs are done, and wait for them.
    pub(crate) fn join(mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn work(jobs: &Mutex<Receiver<Job>>) {
    loop {
        // The lock is held only while taking a job, never while running one.
        let job = jobs.lock().recv();
        match job {
            Ok(job) => {
                let _ = catch_unwind(AssertUnwindSafe(job));
            }
            Err(_) => return,
        }
    }
}
