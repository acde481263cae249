//! COMPARE AND WRITE through both nodes of a pair (real sockets, a real etcd): one winner per
//! round, both disks equal, and a CAW while the peer is lost.

mod support;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use blockstore::BlockDevice;
use support::*;

/// Both nodes CAW the same block at once, from the same expected content to different new
/// content, `ROUNDS` times, while plain writes go to the neighbouring blocks through both.
const ROUNDS: u64 = 200;
const LBA: u64 = 7;

fn caw(dev: &Arc<dyn BlockDevice>, verify: &[u8], write: &[u8]) -> std::io::Result<Option<u64>> {
    dev.compare_and_write(verify, write, LBA * BS)
        .expect("a replicated LUN compares and writes itself")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_nodes_racing_caws_have_exactly_one_winner_per_round() {
    let pair = Pair::new();
    let (a, b) = (pair.start(0), pair.start(1));
    paired([&a, &b]).await;
    let devs = [a.dev.clone(), b.dev.clone()];
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Plain writes next to the CAW block, through both nodes, all along.
    let mut writers = Vec::new();
    for (n, dev) in devs.iter().cloned().enumerate() {
        let stop = stop.clone();
        writers.push(tokio::task::spawn_blocking(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let lba = LBA - 1 + 2 * (i % 2); // blocks 6 and 8
                dev.write_at(&pattern((n as u64) << 40 | i, BS as usize), lba * BS)?;
                i += 1;
            }
            Ok::<_, std::io::Error>(i)
        }));
    }
    let rounds = tokio::task::spawn_blocking(move || {
        let mut current = vec![0u8; BS as usize];
        let mut wins = [0u64; 2];
        for round in 0..ROUNDS {
            let start = Arc::new(Barrier::new(2));
            let racers: Vec<_> = devs
                .iter()
                .cloned()
                .enumerate()
                .map(|(n, dev)| {
                    let (start, verify) = (start.clone(), current.clone());
                    let new = pattern(round << 8 | n as u64 | 1 << 60, BS as usize);
                    std::thread::spawn(move || {
                        start.wait();
                        (caw(&dev, &verify, &new), new)
                    })
                })
                .collect();
            let results: Vec<_> = racers.into_iter().map(|t| t.join().unwrap()).collect();
            let mut winner = None;
            for (n, (result, new)) in results.into_iter().enumerate() {
                match result {
                    Ok(None) => {
                        assert!(winner.is_none(), "round {round}: both nodes' CAWs won");
                        winner = Some(new);
                        wins[n] += 1;
                    }
                    // The loser's compare saw the winner's data: the first byte differs (the
                    // patterns differ from the start).
                    Ok(Some(i)) => assert!(i < BS, "round {round}: miscompare at {i}"),
                    Err(e) => panic!("round {round}: node {n}'s CAW failed: {e}"),
                }
            }
            current = winner.unwrap_or_else(|| panic!("round {round}: no CAW won"));
        }
        (current, wins)
    });
    let (last, wins) = rounds.await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut plain = 0;
    for w in writers {
        plain += w.await.unwrap().unwrap();
    }
    println!(
        "{ROUNDS} rounds: node 0 won {}, node 1 won {}; {plain} plain writes beside them",
        wins[0], wins[1]
    );
    assert_eq!(wins[0] + wins[1], ROUNDS);
    // Both nodes read the last winner's data, and the disks are equal.
    for n in [&a, &b] {
        assert!(read(&n.dev, LBA, 1).await.unwrap() == last);
    }
    flush(&a.dev).await.unwrap();
    flush(&b.dev).await.unwrap();
    let [d0, d1] = pair.local_images();
    assert!(d0 == d1, "the disks differ after the CAW rounds");
    let at = (LBA * BS) as usize;
    assert!(d0[at..at + BS as usize] == last[..]);
    a.lun.shutdown().await;
    b.lun.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caw_waits_for_the_race_and_runs_alone_on_the_survivor() {
    let pair = Pair::new();
    let (a, b) = (pair.start(0), pair.start(1));
    paired([&a, &b]).await;
    // Node 1 follows: its CAW runs on node 0.
    let first = pattern(1, BS as usize);
    let dev = b.dev.clone();
    let (zeros, w) = (vec![0u8; BS as usize], first.clone());
    let r = tokio::task::spawn_blocking(move || caw(&dev, &zeros, &w))
        .await
        .unwrap();
    assert_eq!(r.unwrap(), None);
    assert!(read(&a.dev, LBA, 1).await.unwrap() == first);
    assert!(b.lun.status().stats.caws_forwarded == 1);
    assert!(a.lun.status().stats.caws == 1);
    b.lun.shutdown().await;
    // Node 0 alone: a CAW waits for the epoch, then compares and writes alone.
    let dev = a.dev.clone();
    let second = pattern(2, BS as usize);
    let (f, s) = (first.clone(), second.clone());
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(move || (caw(&dev, &f, &s), caw(&dev, &f, &s))),
    )
    .await
    .expect("a CAW on the survivor never completed")
    .unwrap();
    assert_eq!(r.0.unwrap(), None);
    assert_eq!(
        r.1.unwrap(),
        Some(0),
        "the second CAW must see the first's data"
    );
    assert_eq!(a.lun.status().state, "Alone");
    assert!(read(&a.dev, LBA, 1).await.unwrap() == second);
    a.lun.shutdown().await;
}
