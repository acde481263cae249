//! RBD images on a real Ceph cluster (Debian's 16.2 packages, started by the test on a
//! loopback address of its own). Root only.

use blockstore::BlockDevice;
use lanes_rbd::{Error, RbdDevice, RbdSource};
use lanes_test_support::ceph::Cluster;

fn source(cluster: &Cluster, image: &str) -> RbdSource {
    RbdSource {
        pool: "rbd".into(),
        image: image.into(),
        ceph_conf: cluster.conf.clone(),
        client: "admin".into(),
    }
}

#[test]
fn two_gateways_share_an_image_and_exclusive_lock_is_refused() {
    let cluster = Cluster::start(2);
    cluster.image("shared", "64M");

    // Two clients of one image, as two gateways: each sees the other's writes at once.
    let a = RbdDevice::open(&source(&cluster, "shared")).expect("open on gateway a");
    let b = RbdDevice::open(&source(&cluster, "shared")).expect("open on gateway b");
    assert_eq!(a.size_bytes(), 64 << 20);
    assert_eq!(a.image_id(), b.image_id());
    assert!(!a.image_id().is_empty());

    let block: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    a.write_vectored_at(&[&block[..4096], &block[4096..]], 1 << 20)
        .unwrap();
    a.flush().unwrap();
    let mut seen = vec![0u8; 8192];
    b.read_at(&mut seen, 1 << 20).unwrap();
    assert_eq!(seen, block, "gateway b reads gateway a's write");

    // b overwrites half; a sees it (no client cache on either).
    b.write_at(&[0xEE; 4096], (1 << 20) + 4096).unwrap();
    a.read_at(&mut seen, 1 << 20).unwrap();
    assert_eq!(&seen[..4096], &block[..4096]);
    assert!(seen[4096..].iter().all(|x| *x == 0xEE));

    // A discard reads back zeros, partial object ranges included.
    a.punch_hole((1 << 20) + 512, 1024).unwrap();
    b.read_at(&mut seen, 1 << 20).unwrap();
    assert!(
        seen[512..1536].iter().all(|x| *x == 0),
        "discarded range reads zeros"
    );
    assert_eq!(&seen[..512], &block[..512]);

    // Out of range is an error, not a crash.
    assert!(a.write_at(&[0; 512], 64 << 20).is_err());

    // An image with the default features (exclusive-lock) is refused, naming the fix.
    cluster.rbd(&["create", "rbd/locked", "--size", "16M"]);
    let err = RbdDevice::open(&source(&cluster, "locked"))
        .err()
        .expect("exclusive-lock refused");
    assert!(matches!(err, Error::ExclusiveLock { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("rbd feature disable rbd/locked") && text.contains("exclusive-lock"),
        "{text}"
    );
    // A missing image is an error naming it.
    let err = RbdDevice::open(&source(&cluster, "missing"))
        .err()
        .expect("no such image");
    assert!(err.to_string().contains("missing"), "{err}");
}
