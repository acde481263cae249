//! The fault campaigns' load: workers writing and reading 4 KiB blocks through `lanes
//! attach`'s multipath device, each on its own blocks, every read checked by the oracle
//! against the writes acknowledged before it began. Shared by ha_faults.rs and rbd_faults.rs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use lanes_initiator::Multipath;

use super::oracle::{self, Slot};
use super::BS;

pub struct Load {
    /// Blocks per worker.
    slots_per_worker: u64,
    pub stop: AtomicBool,
    pub errors: AtomicU64,
    pub done: AtomicU64,
    pub worst: Mutex<Duration>,
    pub violations: Mutex<Vec<String>>,
    pub slots: Mutex<Vec<Slot>>,
}

impl Load {
    /// `workers` writers with `slots_per_worker` blocks each.
    pub fn new(workers: u64, slots_per_worker: u64) -> Load {
        Load {
            slots_per_worker,
            stop: AtomicBool::new(false),
            errors: AtomicU64::new(0),
            done: AtomicU64::new(0),
            worst: Mutex::new(Duration::ZERO),
            violations: Mutex::new(Vec::new()),
            slots: Mutex::new(vec![Slot::default(); (workers * slots_per_worker) as usize]),
        }
    }

    /// One worker: writes 2 of 3 requests to its own slots, reads the third and checks it.
    pub async fn worker(self: Arc<Self>, mp: Arc<Multipath>, w: u64) {
        let mut v = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            v += 1;
            let n = self.slots_per_worker;
            let slot = (w * n + v * 7 % n) as usize;
            let offset = slot as u64 * BS as u64;
            let start = Instant::now();
            if !v.is_multiple_of(3) {
                match mp
                    .write(offset, Bytes::from(oracle::block(offset, w, v)), false)
                    .await
                {
                    Ok(()) => self.slots.lock().unwrap()[slot].acknowledged(v),
                    Err(e) => {
                        eprintln!("worker {w}: write at {offset}: {e}");
                        self.errors.fetch_add(1, Ordering::Relaxed);
                        self.slots.lock().unwrap()[slot].maybe = Some(v);
                    }
                }
            } else {
                let expected = self.slots.lock().unwrap()[slot];
                match mp.read(offset, BS as u32).await {
                    Ok(got) => {
                        let checked = oracle::decode(&got, offset)
                            .and_then(|seen| expected.check(&seen, w, offset));
                        if let Err(why) = checked {
                            self.violations.lock().unwrap().push(why);
                        }
                    }
                    Err(e) => {
                        eprintln!("worker {w}: read at {offset}: {e}");
                        self.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            let took = start.elapsed();
            let mut m = self.worst.lock().unwrap();
            *m = (*m).max(took);
            drop(m);
            self.done.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits (bounded) until `n` more requests completed.
    pub fn progress(&self, n: u64, what: &str) {
        let start = self.done.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.done.load(Ordering::Relaxed) < start + n {
            assert!(Instant::now() < deadline, "no progress: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
