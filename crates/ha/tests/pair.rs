//! A pair of replicated LUNs: replication, failover, resync, concurrent writers, fencing
//! without the witness.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_one_node_are_on_both_disks_and_readable_on_the_other() {
    let pair = Pair::new();
    let (a, b) = (pair.start(0), pair.start(1));
    paired([&a, &b]).await;
    let mut written = Vec::new();
    for i in 0..32u64 {
        let (lba, blocks) = ((i * 61) % (BLOCKS - 16), 1 + i % 16);
        let data = pattern(i, (blocks * BS) as usize);
        write(&a.dev, lba, data.clone()).await.unwrap();
        written.push((lba, data));
    }
    flush(&a.dev).await.unwrap();
    let mut expect = vec![0u8; (BLOCKS * BS) as usize];
    for (lba, data) in &written {
        let at = (lba * BS) as usize;
        expect[at..at + data.len()].copy_from_slice(data);
    }
    let [d0, d1] = pair.local_images();
    assert!(d0 == expect, "node 0's disk lacks acknowledged writes");
    assert!(d1 == expect, "node 1's disk lacks acknowledged writes");
    for (lba, data) in &written {
        let got = read(&b.dev, *lba, data.len() as u64 / BS).await.unwrap();
        assert!(&got == data, "read on node 1 at {lba} differs");
    }
    a.lun.shutdown().await;
    b.lun.shutdown().await;
}

/// The asynchronous side (what the iSCSI target uses for READ and WRITE): 32 writes of
/// 1-16 blocks in flight at once from node 0, split into two segments each, a flush, then
/// asynchronous reads on node 1; both disks hold every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_writes_are_on_both_disks_and_read_back_asynchronously_on_the_other() {
    use blockstore::aio_pair;
    use bytes::{Bytes, BytesMut};
    let pair = Pair::new();
    let (a, b) = (pair.start(0), pair.start(1));
    paired([&a, &b]).await;
    let (aa, ab) = (a.dev.aio().expect("aio"), b.dev.aio().expect("aio"));
    let mut waits = Vec::new();
    let mut written = Vec::new();
    for i in 0..32u64 {
        // Disjoint ranges: writes in flight together may complete in any order.
        let (lba, blocks) = (i * 17, 1 + i % 16);
        let data = pattern(1000 + i, (blocks * BS) as usize);
        let cut = data.len() / 3;
        let segs = vec![
            Bytes::copy_from_slice(&data[..cut]),
            Bytes::copy_from_slice(&data[cut..]),
        ];
        let (done, wait) = aio_pair();
        aa.write(segs, lba * BS, done);
        waits.push(wait);
        written.push((lba, data));
    }
    for w in waits {
        w.await.expect("answered").expect("replicated write");
    }
    let (done, wait) = aio_pair();
    aa.flush(done);
    wait.await.expect("answered").expect("flush");
    let mut expect = vec![0u8; (BLOCKS * BS) as usize];
    for (lba, data) in &written {
        let at = (lba * BS) as usize;
        expect[at..at + data.len()].copy_from_slice(data);
    }
    let [d0, d1] = pair.local_images();
    assert!(d0 == expect, "node 0's disk lacks acknowledged writes");
    assert!(d1 == expect, "node 1's disk lacks acknowledged writes");
    for (lba, data) in &written {
        let (done, wait) = aio_pair();
        // Appended after a prefix the read must keep.
        let buf = BytesMut::from(&b"pre"[..]);
        ab.read(buf, data.len(), lba * BS, done);
        let (r, got) = wait.await.expect("answered");
        r.expect("read on node 1");
        assert_eq!(&got[..3], b"pre");
        assert!(
            got[3..] == data[..],
            "asynchronous read on node 1 at {lba} differs"
        );
    }
    // An unaligned request is refused through its completion.
    let (done, wait) = aio_pair();
    aa.write(vec![Bytes::from_static(&[1; 100])], 0, done);
    assert!(wait.await.expect("answered").is_err());
    a.lun.shutdown().await;
    // The peer is gone: the survivor's answer comes through the completion, never a hang.
    let (done, wait) = aio_pair();
    aa.write(vec![Bytes::from(vec![2u8; BS as usize])], 0, done);
    assert!(
        wait.await.expect("answered").is_err(),
        "node 0 was shut down"
    );
    b.lun.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_survivor_wins_the_race_goes_on_alone_and_resyncs_its_returning_peer() {
    survivor_resyncs_returning_peer(false).await;
}

/// As above, but node 1 had applied a write node 0 never got when it stopped: the block,
/// inside node 1's activity-log extent, differs and is copied back from node 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_only_the_crashed_node_applied_is_copied_back_on_return() {
    survivor_resyncs_returning_peer(true).await;
}

async fn survivor_resyncs_returning_peer(stray_write: bool) {
    let pair = Pair::new();
    let (a, b) = (pair.start(0), pair.start(1));
    paired([&a, &b]).await;
    for i in 0..16u64 {
        write(&a.dev, i * 8, pattern(i, (8 * BS) as usize))
            .await
            .unwrap();
    }
    // Node 1 goes away; a write right after must be acknowledged once node 0 won the epoch.
    b.lun.shutdown().await;
    // A block inside node 1's activity-log extent (0..1024) that nobody writes below.
    let stray = 1021;
    if stray_write {
        // What a crash between node 1's local apply and its send leaves behind.
        pair.disks[1]
            .write_at(&pattern(77, BS as usize), stray * BS)
            .unwrap();
    }
    let t = Instant::now();
    write(&a.dev, 500, pattern(1000, BS as usize))
        .await
        .unwrap();
    let gap = t.elapsed();
    let s = a.lun.status();
    assert_eq!((s.state, s.epoch), ("Alone", 1), "{s:?}");
    assert!(gap < Duration::from_secs(2), "failover took {gap:?}");
    println!("failover: first write acknowledged alone after {gap:?}");
    // Writing alone: 100 random 4 KiB blocks.
    let mut alone_blocks = 1u64;
    for i in 0..100u64 {
        let lba = (i * 7919) % BLOCKS;
        write(&a.dev, lba, pattern(2000 + i, BS as usize))
            .await
            .unwrap();
        alone_blocks += 1;
    }
    // One region per block: the distinct blocks written alone are exactly the dirty regions.
    let mut distinct: Vec<u64> = (0..100u64).map(|i| (i * 7919) % BLOCKS).collect();
    distinct.push(500);
    distinct.sort_unstable();
    distinct.dedup();
    let dirty = distinct.len() as u64;
    wait_status(&a, "dirty tracking", |s| s.dirty_regions == dirty).await;
    // Node 1 comes back on its own files: it is resynced and serves again.
    let b = pair.start(1);
    paired([&a, &b]).await;
    let stats = a.lun.status().stats;
    let (resync, compared) = (stats.resync_blocks, stats.resync_compared_blocks);
    println!(
        "resync: {resync} blocks copied, {compared} compared by checksum, for {alone_blocks} \
         blocks written alone ({dirty} distinct)"
    );
    // Node 1 stopped as if it crashed: the activity-log extent its last writes touched (blocks
    // 0..1024, one extent) is compared block by block, except its blocks node 0 wrote alone
    // (dirty, copied whole); only a block that differs there is copied.
    let al_extent = replication::Config::new(0, 0, BLOCKS).al_extent_blocks;
    assert!(!distinct.contains(&stray));
    let dirty_in_extent = distinct.iter().filter(|&&b| b < al_extent).count() as u64;
    assert_eq!(compared, al_extent - dirty_in_extent, "resync {stats:?}");
    assert_eq!(resync, dirty + u64::from(stray_write), "resync {stats:?}");
    flush(&a.dev).await.unwrap();
    let [d0, d1] = pair.local_images();
    assert_eq!(checksum(&d0), checksum(&d1), "disks differ after resync");
    assert!(d0 == d1);
    // And node 1 serves the data written while it was away.
    let got = read(&b.dev, 500, 1).await.unwrap();
    assert!(got == pattern(1000, BS as usize));
    let got = read(&b.dev, stray, 1).await.unwrap();
    assert!(
        got == vec![0u8; BS as usize],
        "node 1 kept a write node 0 never had"
    );
    // The sync source cleared the marks in etcd: either node may win a later race.
    let witness = lanes_witness::Witness::new(pair.config(1).witness);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = witness.read().await.unwrap().record;
        if r.holder.is_none() && r.outdated.is_none() {
            assert_eq!(r.epoch, 1);
            break;
        }
        assert!(Instant::now() < deadline, "marks never cleared: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.lun.shutdown().await;
    b.lun.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_overlapping_writes_on_both_nodes_leave_equal_disks() {
    let pair = Pair::new();
    let (a, b) = (pair.start(0), pair.start(1));
    paired([&a, &b]).await;
    let mut tasks = Vec::new();
    for (n, dev) in [a.dev.clone(), b.dev.clone()].into_iter().enumerate() {
        for t in 0..4u64 {
            let dev = dev.clone();
            tasks.push(tokio::task::spawn_blocking(move || {
                for i in 0..150u64 {
                    let seed = (n as u64) << 32 | t << 16 | i;
                    let blocks = 1 + seed % 5;
                    let lba = (seed.wrapping_mul(2654435761) >> 7) % (64 - blocks);
                    dev.write_at(&pattern(seed, (blocks * BS) as usize), lba * BS)?;
                }
                Ok::<_, std::io::Error>(())
            }));
        }
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    flush(&a.dev).await.unwrap();
    flush(&b.dev).await.unwrap();
    let [d0, d1] = pair.local_images();
    assert!(d0[..64 * BS as usize] != vec![0u8; 64 * BS as usize][..]);
    assert_eq!(checksum(&d0), checksum(&d1), "disks differ");
    assert!(d0 == d1);
    a.lun.shutdown().await;
    b.lun.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_etcd_a_pair_keeps_serving_and_a_lone_node_acknowledges_nothing() {
    let mut pair = Pair::new();
    let (a, b) = (pair.start(0), pair.start(1));
    paired([&a, &b]).await;
    pair.etcd.kill();
    for i in 0..20u64 {
        write(&a.dev, i, pattern(i, BS as usize)).await.unwrap();
        write(&b.dev, 100 + i, pattern(100 + i, BS as usize))
            .await
            .unwrap();
    }
    assert_eq!(a.lun.status().state, "Paired");
    // Peer and etcd gone: node 0 may not acknowledge alone.
    b.lun.shutdown().await;
    let dev = a.dev.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(dev.write_at(&pattern(7777, BS as usize), 300 * BS));
    });
    let waited = tokio::task::spawn_blocking(move || {
        let r = rx.recv_timeout(Duration::from_secs(3));
        (r, rx)
    })
    .await
    .unwrap();
    let (first, rx) = waited;
    let held = first.is_err();
    if let Ok(Ok(())) = first {
        panic!("a write was acknowledged without peer and without etcd");
    }
    let s = a.lun.status();
    assert!(s.state == "Suspended" && s.epoch == 0, "{s:?}");
    // etcd returns: node 0 wins, and a held write completes.
    pair.etcd.restart();
    wait_status(&a, "winning once etcd is back", |s| s.state == "Alone").await;
    if held {
        let r = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(10)))
            .await
            .unwrap();
        assert!(matches!(r, Ok(Ok(()))), "held write: {r:?}");
    }
    write(&a.dev, 301, pattern(7778, BS as usize))
        .await
        .unwrap();
    a.lun.shutdown().await;
}

/// Completed writes so far, and a bounded wait for `n` more.
async fn wait_count(count: &AtomicU64, n: u64, what: &str) {
    let target = count.load(Ordering::Relaxed) + n;
    let deadline = Instant::now() + Duration::from_secs(15);
    while count.load(Ordering::Relaxed) < target {
        assert!(
            Instant::now() < deadline,
            "{what}: too few writes completed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_busy_peer_leaves_no_write_stuck_on_the_survivor() {
    let pair = Pair::new();
    let (a, b) = (pair.start(0), pair.start(1));
    paired([&a, &b]).await;
    // Writers on both nodes over the same 64 blocks; node 1 stops in the middle of it.
    let stop = Arc::new(AtomicBool::new(false));
    let on_a = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for (n, dev) in [a.dev.clone(), b.dev.clone()].into_iter().enumerate() {
        for t in 0..4u64 {
            let (dev, stop, on_a) = (dev.clone(), stop.clone(), on_a.clone());
            writers.push(tokio::task::spawn_blocking(move || {
                let mut i = 0u64;
                let mut worst = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) && i < 1_000_000 {
                    i += 1;
                    let seed = (n as u64) << 40 | t << 32 | i;
                    let lba = seed.wrapping_mul(2654435761) % 60;
                    let start = Instant::now();
                    let r = dev.write_at(&pattern(seed, (4 * BS) as usize), lba * BS);
                    worst = worst.max(start.elapsed());
                    if n == 1 && r.is_err() {
                        break; // node 1 stopped under it
                    }
                    r.unwrap_or_else(|e| panic!("node 0 write failed: {e}"));
                    if n == 0 {
                        on_a.fetch_add(1, Ordering::Relaxed);
                    }
                }
                (n, i, worst)
            }));
        }
    }
    wait_count(&on_a, 500, "paired").await;
    b.lun.shutdown().await;
    wait_status(&a, "going on alone", |s| s.state == "Alone").await;
    wait_count(&on_a, 2000, "alone").await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let (n, i, worst) = tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("a writer is stuck")
            .unwrap();
        println!("node {n} writer: {i} writes, slowest {worst:?}");
        if n == 0 {
            assert!(
                worst < Duration::from_secs(3),
                "a write on node 0 took {worst:?}"
            );
        }
    }
    a.lun.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_replication_port_costs_at_most_a_reconnect() {
    use tokio::io::AsyncWriteExt as _;
    let pair = Pair::new();
    let (a, b) = (pair.start(0), pair.start(1));
    paired([&a, &b]).await;
    // Node 1 accepts the peer link. Junk without a preamble, a preamble naming the wrong
    // node, and a well-formed session (as node 0) that then sends corrupt frames.
    let listen = pair.listen[1];
    let mut junk = tokio::net::TcpStream::connect(listen).await.unwrap();
    junk.write_all(&[0xff; 4096]).await.unwrap();
    let mut wrong = tokio::net::TcpStream::connect(listen).await.unwrap();
    wrong
        .write_all(b"LNHA\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let mut forged = Vec::new();
    for channel in [0u8, 1] {
        let mut s = tokio::net::TcpStream::connect(listen).await.unwrap();
        let mut pre = b"LNHA\x00\x00\x00\x00\x07\x07\x07\x07\x07\x07\x07\x07".to_vec();
        pre[5] = channel;
        s.write_all(&pre).await.unwrap();
        forged.push(s);
    }
    for s in &mut forged {
        // A frame header claiming 1 MiB, then a wrong checksum.
        let mut frame = (1u32 << 20).to_le_bytes().to_vec();
        frame.extend(std::iter::repeat_n(0xA5, 1 << 20));
        let _ = s.write_all(&frame).await;
    }
    drop(forged);
    // The forged session displaced the real one (node 1 lost its peer), then broke on its
    // first frame; the pair comes back and replicates.
    wait_status(&b, "the forged session", |s| s.stats.peer_lost >= 1).await;
    paired([&a, &b]).await;
    let data = pattern(77, (8 * BS) as usize);
    write(&a.dev, 40, data.clone()).await.unwrap();
    flush(&a.dev).await.unwrap();
    let [d0, d1] = pair.local_images();
    let at = (40 * BS) as usize;
    assert!(d0[at..at + data.len()] == data[..] && d0 == d1);
    drop((junk, wrong));
    a.lun.shutdown().await;
    b.lun.shutdown().await;
}
