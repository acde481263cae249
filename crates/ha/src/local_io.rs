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

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

/// Threads per LUN: local writes to different blocks run side by side (and one slow fsync or
/// FUA write does not stop the others). Four, not more: buffered writes to one file serialize
/// on its inode lock, and more threads only add wake-ups (`bench/ha-pair`, 4K random writes
/// on 2 cores: 0.56 of the single node with 8 threads, 0.64 with 4 and 0.61 with 2; QD1 p50
/// 217, 184 and 172 us).
pub(crate) const THREADS: usize = 4;

pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

/// The jobs not yet taken, and whether more may come.
struct Queue {
    jobs: Mutex<(VecDeque<Job>, bool)>,
    ready: Condvar,
}

pub(crate) struct LocalIo {
    queue: Arc<Queue>,
    threads: Vec<JoinHandle<()>>,
}

impl LocalIo {
    /// Start `n` threads named after `name`.
    pub(crate) fn start(name: &str, n: usize) -> std::io::Result<LocalIo> {
        let queue = Arc::new(Queue {
            jobs: Mutex::new((VecDeque::with_capacity(64), true)),
            ready: Condvar::new(),
        });
        let mut io = LocalIo {
            queue,
            threads: Vec::with_capacity(n),
        };
        for i in 0..n.max(1) {
            let queue = io.queue.clone();
            let thread = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&queue))?;
            io.threads.push(thread);
        }
        Ok(io)
    }

    /// Queue `job`. A job that panics ends only itself (the thread goes on); jobs that must
    /// report an outcome catch their own panics (`Driver::blocking`).
    pub(crate) fn run(&self, job: Job) {
        let mut q = self.queue.jobs.lock();
        if q.1 {
            q.0.push_back(job);
            drop(q);
            // One sleeping thread is enough per job; a busy one takes it otherwise.
            self.queue.ready.notify_one();
        }
    }

    /// Let the threads end once the queued jobs are done, and wait for them.
    pub(crate) fn join(mut self) {
        self.queue.jobs.lock().1 = false;
        self.queue.ready.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for LocalIo {
    /// Dropped without `join` (the LUN's task ended abruptly): the threads still finish the
    /// queued jobs and end.
    fn drop(&mut self) {
        self.queue.jobs.lock().1 = false;
        self.queue.ready.notify_all();
    }
}

fn work(queue: &Queue) {
    loop {
        // The lock is held only while taking a job, never while running one or waiting.
        let job = {
            let mut q = queue.jobs.lock();
            loop {
                if let Some(job) = q.0.pop_front() {
                    break job;
                }
                if !q.1 {
                    return;
                }
                queue.ready.wait(&mut q);
            }
        };
        let _ = catch_unwind(AssertUnwindSafe(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::channel;

    #[test]
    fn every_queued_job_runs_before_join_returns() {
        let io = LocalIo::start("t", 3).unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..200 {
            let done = done.clone();
            io.run(Box::new(move || {
                done.fetch_add(1, Ordering::SeqCst);
            }));
        }
        io.join();
        assert_eq!(done.load(Ordering::SeqCst), 200);
    }

    #[test]
    fn a_job_blocked_on_one_thread_does_not_stop_the_others() {
        let io = LocalIo::start("t", 2).unwrap();
        let (release_tx, release_rx) = channel::<()>();
        let (ran_tx, ran_rx) = channel::<u32>();
        io.run(Box::new(move || {
            let _ = release_rx.recv();
        }));
        for i in 0..10 {
            let ran = ran_tx.clone();
            io.run(Box::new(move || {
                let _ = ran.send(i);
            }));
        }
        // All ten run on the second thread while the first still waits.
        let got: Vec<u32> = (0..10).map(|_| ran_rx.recv().unwrap()).collect();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        release_tx.send(()).unwrap();
        io.join();
    }

    #[test]
    fn a_panicking_job_ends_only_itself() {
        let io = LocalIo::start("t", 1).unwrap();
        let (tx, rx) = channel::<()>();
        io.run(Box::new(|| panic!("job panics")));
        io.run(Box::new(move || {
            let _ = tx.send(());
        }));
        rx.recv().unwrap();
        io.join();
    }

    #[test]
    fn dropping_without_join_still_runs_the_queued_jobs() {
        let (tx, rx) = channel::<()>();
        {
            let io = LocalIo::start("t", 1).unwrap();
            io.run(Box::new(move || {
                let _ = tx.send(());
            }));
        }
        rx.recv().unwrap();
    }
}
