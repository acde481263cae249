//! `lanes attach`'s multipath device over the four paths of an HA pair (two per node) in the
//! lab, through kill -9 of a node: both of that node's paths fail at once, their commands are
//! replayed on the other node's paths (which hold writes until it won the epoch), no request
//! fails, and every block reads back as last acknowledged.
//!
//! Needs root, ip, tc and etcd (fails, not skips, without them). Traffic stays inside the
//! lab's namespaces.

mod ha_rig;

use std::time::{Duration, Instant};

use ha_rig::*;
use lanes_test_support::serve::Signal;

/// The host attaches one multipath device over all four paths (two per node): the paths agree
/// on one LUN. Under a 4 KiB read/write load, kill -9 of node1 costs no application-visible
/// error (node1's paths fail, their commands are replayed on node2's, which holds writes until
/// it won the epoch), and every block reads back as last acknowledged.
#[test]
fn a_host_over_four_paths_rides_through_kill_9_of_a_node() {
    use bytes::Bytes;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    let _ = tracing_subscriber::fmt()
        .with_env_filter("lanes_initiator=info")
        .try_init();
    let mut rig = pair_rig("mp");
    let mp = attach_four_paths(&mut rig);

    // 16 workers, each owning 32 slots of 4 KiB: 2 of 3 requests writes.
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let worst = Arc::new(Mutex::new(Duration::ZERO));
    let oracle: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let workers = rig.in_host({
        let (mp, stop, errors, done, worst, oracle) = (
            mp.clone(),
            stop.clone(),
            errors.clone(),
            done.clone(),
            worst.clone(),
            oracle.clone(),
        );
        async move {
            (0..16u64)
                .map(|w| {
                    let (mp, stop, errors, done, worst, oracle) = (
                        mp.clone(),
                        stop.clone(),
                        errors.clone(),
                        done.clone(),
                        worst.clone(),
                        oracle.clone(),
                    );
                    tokio::spawn(async move {
                        let mut v = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            v += 1;
                            let offset = (w * 32 + v * 7 % 32) * BS as u64;
                            let start = Instant::now();
                            let write = !v.is_multiple_of(3);
                            let r = if write {
                                let data = Bytes::from(pattern(offset ^ (v << 32), BS));
                                mp.write(offset, data, false).await
                            } else {
                                mp.read(offset, BS as u32).await.map(|_| ())
                            };
                            let took = start.elapsed();
                            let mut m = worst.lock().unwrap();
                            *m = (*m).max(took);
                            drop(m);
                            match r {
                                Ok(()) if write => {
                                    oracle.lock().unwrap().insert(offset, v);
                                }
                                Ok(()) => {}
                                Err(e) => {
                                    eprintln!("worker {w}: {e}");
                                    errors.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect::<Vec<_>>()
        }
    });
    let wait_done = |n: u64, what: &str| {
        let (start, deadline) = (
            done.load(Ordering::Relaxed),
            Instant::now() + Duration::from_secs(20),
        );
        while done.load(Ordering::Relaxed) < start + n {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_done(2000, "load before the kill");
    *worst.lock().unwrap() = Duration::ZERO;
    rig.serves[0]
        .as_mut()
        .unwrap()
        .stop(Signal::Kill, Duration::from_secs(10))
        .expect("node1 exits");
    rig.serves[0] = None;
    wait_done(3000, "load after the kill");
    rig.wait_role(2, "Alone", Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    rig.in_host(async move {
        for w in workers {
            w.await.unwrap();
        }
    });
    for p in mp.status().paths {
        println!(
            "path {} {} group {} state {} alua {} eligible {} errors {} history {:?}",
            p.path, p.portal, p.portal_group, p.state, p.alua, p.eligible, p.errors, p.history
        );
    }
    let stall = *worst.lock().unwrap();
    println!(
        "multipath: longest request across kill -9 of node1: {stall:?}, {} errors",
        errors.load(Ordering::Relaxed)
    );
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "application-visible errors"
    );
    let expected: Vec<(u64, u64)> = oracle
        .lock()
        .unwrap()
        .iter()
        .map(|(o, v)| (*o, *v))
        .collect();
    assert!(expected.len() > 100);
    rig.in_host(async move {
        for (offset, v) in expected {
            let got = mp.read(offset, BS as u32).await.unwrap();
            assert!(
                got[..] == pattern(offset ^ (v << 32), BS)[..],
                "block at {offset} is not version {v}"
            );
        }
    });
}
