//! Acknowledged writes survive a power loss of either node, and a replacement node is
//! copied in full.

mod support;

use std::sync::Arc;

use blockstore::BlockDevice;
use lanes_ha::ReplicatedLun;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_node_with_a_new_disk_is_copied_in_full() {
    let pair = Pair::new();
    let (a, b) = (pair.start(0), pair.start(1));
    paired([&a, &b]).await;
    for i in 0..8u64 {
        write(&a.dev, i * 100, pattern(i, (4 * BS) as usize))
            .await
            .unwrap();
    }
    b.lun.shutdown().await;
    write(&a.dev, 1500, pattern(99, BS as usize)).await.unwrap();
    assert_eq!(a.lun.status().state, "Alone");
    // Node 1's machine is replaced: a new disk holding garbage, no metadata journal.
    std::fs::remove_file(pair.dir.join("meta1")).unwrap();
    let garbage = pattern(12345, (BLOCKS * BS) as usize);
    pair.disks[1].write_at(&garbage, 0).unwrap();
    let mut cfg = pair.config(1);
    cfg.replacement = true;
    let lun = ReplicatedLun::start(cfg, pair.disks[1].clone()).unwrap();
    let b = Node {
        dev: lun.device(),
        lun,
    };
    paired([&a, &b]).await;
    let s = a.lun.status();
    assert!(s.stats.full_resyncs >= 1, "{s:?}");
    assert!(s.stats.resync_blocks >= BLOCKS, "{s:?}");
    flush(&a.dev).await.unwrap();
    let [d0, d1] = pair.local_images();
    assert!(d0 == d1, "the replacement differs from the survivor");
    a.lun.shutdown().await;
    b.lun.shutdown().await;
}

/// Writes through node 0 (some flushed, some not), then a power loss of `victim` (its
/// volatile cache is gone, a pseudo-random part of it landed); the survivor goes on alone and
/// the victim, restarted on what its disk kept, is resynced to the survivor's data.
async fn power_loss_of(victim: usize) {
    let mut pair = Pair::new();
    let inner = [0, 1].map(|_| Arc::new(blockstore::MemoryDevice::new(BLOCKS * BS)));
    let volatile = inner
        .clone()
        .map(|i| Arc::new(blockstore::VolatileDevice::new(i)));
    pair.disks = volatile.clone().map(|v| v as Arc<dyn BlockDevice>);
    let (a, b) = (pair.start(0), pair.start(1));
    paired([&a, &b]).await;
    let flushed = pattern(1, (16 * BS) as usize);
    write(&a.dev, 10, flushed.clone()).await.unwrap();
    flush(&a.dev).await.unwrap();
    // Durable on both: on each node's backing device, below the volatile cache.
    for (n, d) in inner.iter().enumerate() {
        let mut got = vec![0u8; flushed.len()];
        d.read_at(&mut got, 10 * BS).unwrap();
        assert!(got == flushed, "flushed write not durable on node {n}");
    }
    let unflushed: Vec<(u64, Vec<u8>)> = (0..32u64)
        .map(|i| (100 + i * 37, pattern(100 + i, (2 * BS) as usize)))
        .collect();
    for (lba, data) in &unflushed {
        write(&a.dev, *lba, data.clone()).await.unwrap();
    }
    assert!(volatile[victim].unflushed_sectors() > 0);
    let nodes = [a, b];
    nodes[victim].lun.shutdown().await;
    volatile[victim].power_loss(Some(0x5eed)).unwrap();
    // The victim's disk really lost acknowledged writes: the resync must bring them back.
    let lost = unflushed
        .iter()
        .filter(|(lba, data)| {
            let mut got = vec![0u8; data.len()];
            inner[victim].read_at(&mut got, lba * BS).unwrap();
            got != *data
        })
        .count();
    assert!(lost > 0, "the power loss kept every write");
    let survivor = &nodes[1 - victim];
    wait_status(survivor, "going on alone", |s| s.state == "Alone").await;
    let back = pair.start(victim as u8);
    paired([survivor, &back]).await;
    flush(&survivor.dev).await.unwrap();
    let [d0, d1] = pair.local_images();
    assert!(
        d0 == d1,
        "replicas differ after the power loss of node {victim}"
    );
    for (lba, data) in &unflushed {
        let at = (lba * BS) as usize;
        assert!(
            d0[at..at + data.len()] == data[..],
            "acknowledged write at {lba} lost"
        );
    }
    survivor.lun.shutdown().await;
    back.lun.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_loss_of_the_peer_loses_no_acknowledged_write() {
    power_loss_of(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_loss_of_the_writing_node_loses_no_acknowledged_write() {
    power_loss_of(0).await;
}
