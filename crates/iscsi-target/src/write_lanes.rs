//! Buffered WRITEs that cannot be done without sleeping run here: a few dedicated threads fed
//! by channels, not the connection's task (a write that sleeps in the kernel, on a journal
//! commit or dirty-page throttling, would stop the connection from reading, so its NOP-Outs
//! would go unanswered and hosts would fail a healthy path) and not tokio's blocking pool
//! (dozens of threads contending for the file's inode lock cost four times the CPU per write).
//!
//! Buffered writes serialize on the file's inode lock anyway, so two threads keep the CPU
//! cost low while one that sleeps does not hold the other back.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;

type Job = Box<dyn FnOnce() + Send + 'static>;

const LANES: usize = 2;

struct Lanes {
    senders: Vec<Sender<Job>>,
    next: AtomicUsize,
}

fn lanes() -> &'static Lanes {
    static LANES_CELL: OnceLock<Lanes> = OnceLock::new();
    LANES_CELL.get_or_init(|| {
        let mut senders = Vec::with_capacity(LANES);
        for i in 0..LANES {
            let (tx, rx) = channel::<Job>();
            let spawned = std::thread::Builder::new()
                .name(format!("lanes-write-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        // A job that panics ends its own command only (its task is then
                        // answered by task management or the connection's end).
                        let _ = catch_unwind(AssertUnwindSafe(job));
                    }
                });
            if spawned.is_ok() {
                senders.push(tx);
            }
        }
        Lanes {
            senders,
            next: AtomicUsize::new(0),
        }
    })
}

/// Runs `job` on a write lane, or on tokio's blocking pool when no lane thread could be
/// started.
pub(crate) fn run(job: impl FnOnce() + Send + 'static) {
    let lanes = lanes();
    if lanes.senders.is_empty() {
        tokio::task::spawn_blocking(job);
        return;
    }
    let i = lanes.next.fetch_add(1, Ordering::Relaxed) % lanes.senders.len();
    let sent = match lanes.senders.get(i) {
        Some(tx) => tx.send(Box::new(job)).map_err(|e| e.0),
        None => Err(Box::new(job) as Job),
    };
    if let Err(job) = sent {
        tokio::task::spawn_blocking(job);
    }
}
