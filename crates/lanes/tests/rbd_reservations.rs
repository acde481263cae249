//! Persistent reservations across gateways: two (then three) `lanes serve` processes over one
//! RBD image on a real Ceph cluster (started by the test on a loopback address of its own).
//! A reservation taken through one gateway holds at every other one, and the unit attentions
//! of a preemption or a reset reach every gateway's nexuses. Root only.

use bytes::Bytes;
use lanes_initiator::{LoginOptions, Session};
use lanes_test_support::ceph::Cluster;
use lanes_test_support::serve::ServeChild;

const RESERVATION_CONFLICT: u8 = 0x18;
const WRITE_EXCLUSIVE: u8 = 1;

/// Gateway NAME (its data in DIR/NAME) over image `rbd/IMAGE`.
fn gateway(cluster: &Cluster, image: &str, dir: &std::path::Path, name: &str) -> ServeChild {
    cluster.gateway(
        env!("CARGO_BIN_EXE_lanes"),
        "iqn.2026-11.io.lanes:ceph-pr",
        &format!("rbd/{image}"),
        &dir.join(name),
    )
}

/// Both scenarios on one cluster, each over an image of its own (a cluster takes about 20 s
/// to start).
#[test]
fn reservations_over_one_cluster() {
    let cluster = Cluster::start(2);
    eprintln!("rbd_reservations: reservations_hold_across_gateways");
    reservations_hold_across_gateways(&cluster);
    eprintln!("rbd_reservations: silent_gateways_are_fenced_by_the_next_change");
    silent_gateways_are_fenced_by_the_next_change(&cluster);
}

async fn login(g: &ServeChild, host: &str) -> Session {
    let s = Session::login(g.portal, &g.target, &LoginOptions::new(host))
        .await
        .expect("login");
    let _ = s.test_unit_ready().await;
    s
}

/// PERSISTENT RESERVE OUT: the SCSI status.
async fn pr_out(s: &Session, action: u8, kind: u8, key: u64, sa_key: u64) -> u8 {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x5F;
    cdb[1] = action;
    cdb[2] = kind;
    cdb[8] = 24;
    let mut p = [0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    let out = s
        .execute(cdb, 0, Some(Bytes::copy_from_slice(&p)))
        .await
        .expect("transport");
    out.status
}

/// PERSISTENT RESERVE IN: (generation, the rest of the answer).
async fn pr_in(s: &Session, action: u8) -> (u32, Vec<u8>) {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x5E;
    cdb[1] = action;
    cdb[8] = 255;
    let out = s.execute(cdb, 255, None).await.expect("transport");
    assert_eq!(out.status, 0, "PERSISTENT RESERVE IN {action}: {out:?}");
    let d = out.data.to_vec();
    assert!(d.len() >= 8, "{d:?}");
    (
        u32::from_be_bytes([d[0], d[1], d[2], d[3]]),
        d[4..].to_vec(),
    )
}

/// READ KEYS: (generation, keys).
async fn keys(s: &Session) -> (u32, Vec<u64>) {
    let (generation, d) = pr_in(s, 0).await;
    let len = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
    let keys = d[4..4 + len]
        .chunks(8)
        .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
        .collect();
    (generation, keys)
}

/// READ RESERVATION: (generation, Some((holder key, type))).
async fn reservation(s: &Session) -> (u32, Option<(u64, u8)>) {
    let (generation, d) = pr_in(s, 1).await;
    match u32::from_be_bytes([d[0], d[1], d[2], d[3]]) {
        0 => (generation, None),
        16 => (
            generation,
            Some((
                u64::from_be_bytes(d[4..12].try_into().unwrap()),
                d[17] & 0x0F,
            )),
        ),
        n => panic!("READ RESERVATION additional length {n}"),
    }
}

/// TEST UNIT READY: (status, sense key, ASC, ASCQ).
async fn tur(s: &Session) -> (u8, Option<(u8, u8, u8)>) {
    let out = s.execute([0; 16], 0, None).await.expect("transport");
    (out.status, out.sense_triplet())
}

/// WRITE(10) of one block at LBA 8: the SCSI status.
async fn write(s: &Session) -> u8 {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x2A;
    cdb[5] = 8;
    cdb[8] = 1;
    let out = s
        .execute(cdb, 0, Some(Bytes::from(vec![0x33; 512])))
        .await
        .expect("transport");
    out.status
}

fn reservations_hold_across_gateways(cluster: &Cluster) {
    cluster.image("prlun", "64M");
    let dir = tempfile::tempdir().unwrap();
    let a = gateway(cluster, "prlun", dir.path(), "a");
    let b = gateway(cluster, "prlun", dir.path(), "b");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let h1 = login(&a, "iqn.2026-11.test:host-1").await;
        let h2 = login(&b, "iqn.2026-11.test:host-2").await;
        assert_eq!(write(&h2).await, 0, "no reservation yet");

        // Host 1 registers and reserves (Write Exclusive) through gateway A.
        assert_eq!(pr_out(&h1, 0, 0, 0, 0x1111).await, 0, "REGISTER");
        assert_eq!(
            pr_out(&h1, 1, WRITE_EXCLUSIVE, 0x1111, 0).await,
            0,
            "RESERVE"
        );
        // Host 2's WRITE through gateway B conflicts; its READ does not (Write Exclusive).
        assert_eq!(write(&h2).await, RESERVATION_CONFLICT);
        assert_eq!(h2.read(8, 1).await.unwrap().len(), 512);
        assert_eq!(write(&h1).await, 0, "the holder writes");

        // READ KEYS and READ RESERVATION agree through both gateways.
        let (gen_a, keys_a) = keys(&h1).await;
        let (gen_b, keys_b) = keys(&h2).await;
        assert_eq!(keys_a, vec![0x1111]);
        assert_eq!((gen_b, keys_b), (gen_a, keys_a));
        let res_a = reservation(&h1).await;
        assert_eq!(res_a, (gen_a, Some((0x1111, WRITE_EXCLUSIVE))));
        assert_eq!(reservation(&h2).await, res_a);

        // Host 1 releases through A: host 2's write through B goes through.
        assert_eq!(
            pr_out(&h1, 2, WRITE_EXCLUSIVE, 0x1111, 0).await,
            0,
            "RELEASE"
        );
        assert_eq!(
            write(&h2).await,
            0,
            "released through A, writable through B"
        );
        assert_eq!(reservation(&h2).await, (gen_a, None));

        // Host 1 reserves again; host 2 registers through B and preempts it.
        assert_eq!(
            pr_out(&h1, 1, WRITE_EXCLUSIVE, 0x1111, 0).await,
            0,
            "RESERVE"
        );
        assert_eq!(write(&h2).await, RESERVATION_CONFLICT);
        assert_eq!(pr_out(&h2, 0, 0, 0, 0x2222).await, 0, "REGISTER");
        assert_eq!(
            pr_out(&h2, 4, WRITE_EXCLUSIVE, 0x2222, 0x1111).await,
            0,
            "PREEMPT"
        );
        // The preemption is visible at A: host 1's nexus there got its unit attention from B
        // (2A/03, as a single node raises it) before B answered, and lost its registration
        // and the reservation.
        assert_eq!(tur(&h1).await, (2, Some((6, 0x2A, 0x03))), "UA at A");
        assert_eq!(tur(&h1).await, (0, None), "reported once");
        assert_eq!(write(&h1).await, RESERVATION_CONFLICT);
        let (gen, keys_a) = keys(&h1).await;
        assert_eq!(keys_a, vec![0x2222]);
        assert!(gen > gen_a, "{gen} after {gen_a}");
        assert_eq!(
            reservation(&h1).await,
            (gen, Some((0x2222, WRITE_EXCLUSIVE)))
        );
        assert_eq!(write(&h2).await, 0, "the new holder writes through B");

        // A gateway started now loads the state from the cluster.
        let c = gateway(cluster, "prlun", dir.path(), "c");
        let h3 = login(&c, "iqn.2026-11.test:host-3").await;
        assert_eq!(
            reservation(&h3).await,
            (gen, Some((0x2222, WRITE_EXCLUSIVE)))
        );
        assert_eq!(write(&h3).await, RESERVATION_CONFLICT);

        // CLEAR through B frees every gateway.
        assert_eq!(pr_out(&h2, 3, 0, 0x2222, 0).await, 0, "CLEAR");
        assert_eq!(write(&h1).await, 0);
        assert_eq!(write(&h3).await, 0);
        let (gen0, none) = keys(&h3).await;
        assert_eq!(none, Vec::<u64>::new());

        // A LOGICAL UNIT RESET through C: every gateway's nexuses have 29/03 once it is
        // answered.
        h3.lun_reset().await.expect("LOGICAL UNIT RESET");
        assert_eq!(tur(&h1).await, (2, Some((6, 0x29, 0x03))), "reset UA at A");
        assert_eq!(tur(&h2).await, (2, Some((6, 0x29, 0x03))), "reset UA at B");
        assert_eq!(tur(&h3).await, (2, Some((6, 0x29, 0x03))), "reset UA at C");

        // Both hosts change their registrations at once through different gateways: every
        // change lands (compare-and-set, the loser redoes it on the winner's state).
        for round in 1..=10u64 {
            let (k1, k2) = (0x1000 + round, 0x2000 + round);
            let (r1, r2) = tokio::join!(pr_out(&h1, 6, 0, 0, k1), pr_out(&h2, 6, 0, 0, k2));
            assert_eq!((r1, r2), (0, 0), "round {round}");
            let (gen_a, mut keys_a) = keys(&h1).await;
            keys_a.sort_unstable();
            assert_eq!(keys_a, vec![k1, k2], "round {round}");
            assert_eq!(gen_a, gen0 + 2 * round as u32, "round {round}");
            let (gen_b, mut keys_b) = keys(&h2).await;
            keys_b.sort_unstable();
            assert_eq!((gen_b, keys_b), (gen_a, keys_a), "round {round}");
        }
    });
}

/// The addresses published in `lanes.gw.IMAGE` (one per live gateway client).
fn published(cluster: &Cluster, image: &str) -> Vec<String> {
    let object = &format!("lanes.gw.{image}"); // lanes_rbd's gateways object for the image
    cluster
        .rados(&["-p", "rbd", "listxattr", object])
        .lines()
        .filter(|name| name.starts_with("client."))
        .map(|name| {
            cluster
                .rados(&["-p", "rbd", "getxattr", object, name])
                .trim()
                .to_string()
        })
        .collect()
}

/// The watches are the gateways' heartbeats. Gateway C is killed (kill -9: it unpublishes
/// nothing) and gateway B paused (SIGSTOP); their watches go silent. The next reservation
/// change, through A, completes once both are fenced: their clients are in the OSD blocklist
/// and their addresses no longer published. B, resumed, is refused by the cluster: its port
/// group turns unavailable.
fn silent_gateways_are_fenced_by_the_next_change(cluster: &Cluster) {
    use lanes_test_support::serve::Signal;
    let image = "prsilent";
    cluster.image(image, "64M");
    let dir = tempfile::tempdir().unwrap();
    let a = gateway(cluster, image, dir.path(), "a");
    let b = gateway(cluster, image, dir.path(), "b");
    let mut c = gateway(cluster, image, dir.path(), "c");
    let before = published(cluster, image);
    assert_eq!(
        before.len(),
        3,
        "one published client per gateway: {before:?}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sa = login(&a, "iqn.2026-11.test:host-a").await;
        let sb = login(&b, "iqn.2026-11.test:host-b").await;
        assert_eq!(write(&sb).await, 0, "B writes before the fault");
        c.stop(Signal::Kill, std::time::Duration::from_secs(10))
            .expect("C exits on SIGKILL");
        b.pause();
        let started = std::time::Instant::now();
        assert_eq!(pr_out(&sa, 0, 0, 0, 0xA1).await, 0, "REGISTER through A");
        println!(
            "REGISTER with B paused and C dead took {:?}",
            started.elapsed()
        );
        let after = published(cluster, image);
        assert_eq!(after.len(), 1, "only A is published now: {after:?}");
        let blocklist = cluster.ceph(&["osd", "blocklist", "ls"]);
        let fenced: Vec<&String> = before.iter().filter(|addr| !after.contains(addr)).collect();
        assert_eq!(fenced.len(), 2, "{before:?} -> {after:?}");
        for addr in fenced {
            assert!(
                blocklist.contains(addr.as_str()),
                "{addr} not in {blocklist}"
            );
        }
        assert!(!blocklist.contains(after[0].as_str()), "A fenced itself");
        b.resume();
        // B learns of its fence from the OSD map with its next I/O.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match tur(&sb).await {
                (2, Some((2, 0x04, 0x0c))) => break,
                (0, _) | (2, Some((6, _, _))) => {
                    let _ = write(&sb).await;
                }
                other => panic!("B answered TEST UNIT READY with {other:?}"),
            }
            assert!(std::time::Instant::now() < deadline, "B never fenced");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(keys(&sa).await.1, vec![0xA1], "A serves on");
    });
}
