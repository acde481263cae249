//! Two `lanes serve` gateways over one RBD image on a real Ceph cluster (Debian's packages,
//! started by the test on a loopback address of its own): the same LUN identity on both, a
//! write through one gateway read back through the other at once, both ways. Root only.

use bytes::Bytes;
use lanes_initiator::{LoginOptions, Session};
use lanes_test_support::ceph::Cluster;
use lanes_test_support::serve::ServeChild;

fn gateway(cluster: &Cluster, dir: &std::path::Path, name: &str) -> ServeChild {
    cluster.gateway(
        env!("CARGO_BIN_EXE_lanes"),
        "iqn.2026-11.io.lanes:ceph",
        "rbd/gw",
        &dir.join(name),
    )
}

async fn login(g: &ServeChild, host: &str) -> Session {
    let s = Session::login(g.portal, &g.target, &LoginOptions::new(host))
        .await
        .expect("login");
    let _ = s.test_unit_ready().await;
    s
}

#[test]
fn two_gateways_over_one_image_see_one_lun() {
    let cluster = Cluster::start(2);
    cluster.image("gw", "64M");
    let dir = tempfile::tempdir().unwrap();
    let a = gateway(&cluster, dir.path(), "a");
    let b = gateway(&cluster, dir.path(), "b");
    assert_eq!(a.wwids, b.wwids, "one LUN identity on every gateway");
    assert!(a.banner.contains("rbd:rbd/gw"), "{}", a.banner);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sa = login(&a, "iqn.2026-11.test:host-a").await;
        let sb = login(&b, "iqn.2026-11.test:host-b").await;
        assert_eq!(sa.read_capacity16().await.unwrap(), (64 << 20 >> 9, 512));
        let id_a = sa.device_identity().await.unwrap().lun;
        let id_b = sb.device_identity().await.unwrap().lun;
        assert!(id_a.is_some());
        assert_eq!(id_a, id_b);

        let data: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        sa.write_fua(2048, Bytes::from(data.clone()), true)
            .await
            .unwrap();
        assert_eq!(sb.read(2048, 128).await.unwrap(), Bytes::from(data.clone()));
        // And the other way, without FUA: no cache on either gateway.
        sb.write_fua(2048, Bytes::from(vec![0x5A; 4096]), false)
            .await
            .unwrap();
        let back = sa.read(2048, 128).await.unwrap();
        assert!(back[..4096].iter().all(|x| *x == 0x5A));
        assert_eq!(&back[4096..], &data[4096..]);
        // UNMAP through one gateway reads back zeros through the other.
        sa.unmap(2048, 8).await.unwrap();
        assert!(sb.read(2048, 8).await.unwrap().iter().all(|x| *x == 0));

        // COMPARE AND WRITE from both gateways at once, as VMware ATS heartbeats race: exactly
        // one GOOD and one MISCOMPARE every round, and the block holds the winner's data.
        let lba = 4096u64;
        let mut current = vec![0x40u8; 512];
        sa.write_fua(lba, Bytes::from(current.clone()), true)
            .await
            .unwrap();
        for round in 0..20u8 {
            let mine = |who: u8| vec![(round * 2 + who) | 0x80; 512];
            let (na, nb) = (mine(0), mine(1));
            let (ra, rb) = tokio::join!(caw(&sa, lba, &current, &na), caw(&sb, lba, &current, &nb));
            let now = sb.read(lba, 1).await.unwrap().to_vec();
            match (ra, rb) {
                (Ok(()), Err(_)) => assert_eq!(now, na, "round {round}"),
                (Err(_), Ok(())) => assert_eq!(now, nb, "round {round}"),
                other => panic!("round {round}: not exactly one winner: {other:?}"),
            }
            current = now;
        }
    });
}

/// COMPARE AND WRITE(16) of one block: Ok on GOOD, Err with the sense on MISCOMPARE.
async fn caw(s: &Session, lba: u64, verify: &[u8], write: &[u8]) -> Result<(), (u8, u8, u8)> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x89;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[13] = 1;
    let data = Bytes::from([verify, write].concat());
    let out = s.execute(cdb, 0, Some(data)).await.expect("transport");
    match (out.status, out.sense_triplet()) {
        (0, _) => Ok(()),
        (2, Some(t)) if t.0 == 0x0e && t.1 == 0x1d => Err(t),
        other => panic!("COMPARE AND WRITE answered {other:?}"),
    }
}
