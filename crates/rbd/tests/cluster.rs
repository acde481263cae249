//! RBD images on a real Ceph cluster (Debian's 16.2 packages, started by the test on a
//! loopback address of its own). Root only.

use blockstore::{aio_pair, AioWait, BlockDevice};
use bytes::{Bytes, BytesMut};
use lanes_rbd::{Error, RadosPrStore, RbdDevice, RbdSource};
use lanes_test_support::ceph::Cluster;
use scsi::{PrStore, StoreResult};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

fn source(cluster: &Cluster, image: &str) -> RbdSource {
    RbdSource {
        pool: "rbd".into(),
        image: image.into(),
        ceph_conf: cluster.conf.clone(),
        client: "admin".into(),
        watch_timeout_s: lanes_rbd::DEFAULT_WATCH_TIMEOUT_S,
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

    asynchronous_io(&a, &b);

    // A discard reads back zeros, partial object ranges included.
    a.punch_hole((1 << 20) + 512, 1024).unwrap();
    b.read_at(&mut seen, 1 << 20).unwrap();
    assert!(
        seen[512..1536].iter().all(|x| *x == 0),
        "discarded range reads zeros"
    );
    assert_eq!(&seen[..512], &block[..512]);

    // WRITE SAME by the OSDs: one 512-byte pattern over 1 MiB + 512 bytes (crossing an object
    // boundary at 4 MiB), read back through the other client; the bytes around it untouched.
    let pattern: Vec<u8> = (0..512u32).map(|i| (i * 13 + 1) as u8).collect();
    let (ws_at, ws_len) = ((4 << 20) - 4096, (1 << 20) + 512);
    a.write_at(&[0x5A; 512], ws_at - 512).unwrap();
    a.write_at(&[0x5A; 512], ws_at + ws_len).unwrap();
    a.write_same(ws_at, ws_len, &pattern)
        .expect("RBD does WRITE SAME itself")
        .unwrap();
    let mut back = vec![0u8; ws_len as usize + 1024];
    b.read_at(&mut back, ws_at - 512).unwrap();
    assert!(back[..512].iter().all(|x| *x == 0x5A), "before the range");
    assert!(
        back[512 + ws_len as usize..].iter().all(|x| *x == 0x5A),
        "after the range"
    );
    for (i, chunk) in back[512..512 + ws_len as usize].chunks(512).enumerate() {
        assert_eq!(chunk, &pattern[..], "pattern copy {i}");
    }
    assert!(
        a.write_same(ws_at, 1000, &pattern).unwrap().is_err(),
        "a length that is not whole patterns is refused"
    );

    // COMPARE AND WRITE at the OSD: written when equal, the first difference reported when not.
    let at = 2 << 20;
    let old = vec![0x11u8; 512];
    a.write_at(&old, at).unwrap();
    assert_eq!(
        a.compare_and_write(&old, &[0x22; 512], at)
            .unwrap()
            .unwrap(),
        None
    );
    let mut now = vec![0u8; 512];
    b.read_at(&mut now, at).unwrap();
    assert!(now.iter().all(|x| *x == 0x22));
    let mut wrong = vec![0x22u8; 512];
    wrong[300] = 0;
    assert_eq!(
        b.compare_and_write(&wrong, &[0x33; 512], at)
            .unwrap()
            .unwrap(),
        Some(300),
        "the offset of the first difference within the request"
    );
    b.read_at(&mut now, at).unwrap();
    assert!(
        now.iter().all(|x| *x == 0x22),
        "nothing written on a miscompare"
    );
    // Two gateways racing, as VMware ATS heartbeats do: exactly one wins every round.
    let a = std::sync::Arc::new(a);
    let b = std::sync::Arc::new(b);
    let mut current = vec![0x22u8; 512];
    for round in 0..20u8 {
        let mine = |who: u8| vec![round.wrapping_mul(2).wrapping_add(who) | 0x80; 512];
        let (ma, mb) = (mine(0), mine(1));
        let race = |dev: std::sync::Arc<RbdDevice>, cmp: Vec<u8>, new: Vec<u8>| {
            std::thread::spawn(move || dev.compare_and_write(&cmp, &new, at).unwrap().unwrap())
        };
        let ta = race(a.clone(), current.clone(), ma.clone());
        let tb = race(b.clone(), current.clone(), mb.clone());
        let (ra, rb) = (ta.join().unwrap(), tb.join().unwrap());
        a.read_at(&mut now, at).unwrap();
        match (ra, rb) {
            (None, Some(_)) => assert_eq!(now, ma, "round {round}"),
            (Some(_), None) => assert_eq!(now, mb, "round {round}"),
            other => panic!("round {round}: not exactly one winner: {other:?}"),
        }
        current = now.clone();
    }
    let a = std::sync::Arc::into_inner(a).unwrap();

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

    shared_reservation_object(&cluster);
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Waits for a request on this thread (woken by the completion, not by polling a clock).
fn wait<T>(mut w: AioWait<T>) -> T {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        match Pin::new(&mut w).poll(&mut cx) {
            Poll::Ready(Some(v)) => return v,
            Poll::Ready(None) => panic!("librbd dropped a request"),
            Poll::Pending => std::thread::park(),
        }
    }
}

/// `rbd_aio_*`: 64 writes in flight at once from gateway a, each completed by librbd's own
/// threads, then read back through gateway b's asynchronous reads; a request past the end
/// fails through its completion and hands its buffer back.
fn asynchronous_io(a: &RbdDevice, b: &RbdDevice) {
    let (aa, ab) = (a.aio().expect("librbd 16 has aio"), b.aio().expect("aio"));
    let base = 8u64 << 20;
    let block = |i: u64| -> Vec<u8> { (0..4096u64).map(|j| (i * 31 + j * 7) as u8).collect() };
    let mut writes = Vec::new();
    for i in 0..64u64 {
        let (done, w) = aio_pair();
        let data = block(i);
        // Two segments per write, as iSCSI data-out PDUs arrive.
        let segs = vec![
            Bytes::copy_from_slice(&data[..1000]),
            Bytes::copy_from_slice(&data[1000..]),
        ];
        aa.write(segs, base + i * 4096, done);
        writes.push(w);
    }
    for w in writes {
        wait(w).expect("asynchronous write");
    }
    let (done, w) = aio_pair();
    aa.flush(done);
    wait(w).expect("asynchronous flush");
    let mut reads = Vec::new();
    for i in 0..64u64 {
        let (done, w) = aio_pair();
        // Every other read appends to a buffer that already holds a prefix.
        let mut buf = BytesMut::with_capacity(16);
        if i % 2 == 1 {
            buf.extend_from_slice(b"pre");
        }
        ab.read(buf, 4096, base + i * 4096, done);
        reads.push(w);
    }
    for (i, w) in reads.into_iter().enumerate() {
        let (r, buf) = wait(w);
        r.expect("asynchronous read");
        let skip = if i % 2 == 1 { 3 } else { 0 };
        assert_eq!(&buf[..skip], &b"pre"[..skip], "the prefix of read {i} kept");
        assert_eq!(
            &buf[skip..],
            &block(i as u64)[..],
            "block {i} through gateway b"
        );
    }
    // The synchronous side sees the same bytes.
    let mut seen = vec![0u8; 4096];
    b.read_at(&mut seen, base + 63 * 4096).unwrap();
    assert_eq!(seen, block(63));
    let (done, w) = aio_pair();
    ab.read(BytesMut::new(), 4096, a.size_bytes(), done);
    let (r, buf) = wait(w);
    assert!(r.is_err(), "past the end");
    assert!(
        buf.is_empty(),
        "the buffer comes back with nothing appended"
    );
    asynchronous_unmap_same_and_compare(a, b, base);
}

/// `rbd_aio_discard`, `rbd_aio_writesame` and `rbd_aio_compare_and_write` from gateway a, the
/// results read through gateway b: a discard (one partial object part included) reads as
/// zeros, a write-same repeats its pattern, a compare-and-write writes only when the compare
/// matches and otherwise reports the first difference, atomically at the OSD.
fn asynchronous_unmap_same_and_compare(a: &RbdDevice, b: &RbdDevice, base: u64) {
    let aa = a.aio().expect("aio");
    assert!(aa.has_extended());
    let read_b = |offset: u64, len: usize| {
        let mut v = vec![0u8; len];
        b.read_at(&mut v, offset).unwrap();
        v
    };
    // Blocks 0..64 hold the pattern written above; discard 3 blocks plus 512 bytes of a 4th.
    let (done, w) = aio_pair();
    aa.discard(base + 4096, 3 * 4096 + 512, done);
    wait(w).expect("asynchronous discard");
    assert_eq!(
        read_b(base + 4096, 3 * 4096 + 512),
        vec![0u8; 3 * 4096 + 512]
    );
    assert_ne!(
        read_b(base + 4 * 4096 + 512, 512),
        vec![0u8; 512],
        "the rest kept"
    );
    let pattern: Vec<u8> = (0..512).map(|i| (i % 13) as u8 + 1).collect();
    let (done, w) = aio_pair();
    aa.write_same(
        Bytes::copy_from_slice(&pattern),
        base + 16 * 4096,
        8 * 4096,
        done,
    );
    wait(w).expect("asynchronous write-same");
    assert_eq!(read_b(base + 16 * 4096, 8 * 4096), pattern.repeat(64));
    // Compare-and-write of one sector: the pattern is there, so the write lands.
    let at = base + 16 * 4096;
    let (done, w) = aio_pair();
    aa.compare_and_write(
        Bytes::copy_from_slice(&pattern),
        Bytes::from(vec![0xC5u8; 512]),
        at,
        done,
    );
    assert_eq!(wait(w).expect("compare-and-write"), None);
    assert_eq!(read_b(at, 512), vec![0xC5u8; 512]);
    // The first difference is reported from the start of the request, synchronously and
    // asynchronously, wherever the sector lies in its object.
    for (off, c) in [
        (at, 0usize),
        (at, 300),
        (base + 17 * 4096 + 1024, 7),
        (512, 511),
    ] {
        let mut cmp = read_b(off, 512);
        cmp[c] ^= 0xFF;
        let sync = a.compare_and_write(&cmp, &[0x33u8; 512], off);
        assert_eq!(
            sync.expect("rbd compares").expect("compared"),
            Some(c as u64)
        );
        let (done, w) = aio_pair();
        aa.compare_and_write(Bytes::from(cmp), Bytes::from(vec![0x33u8; 512]), off, done);
        assert_eq!(
            wait(w).expect("compare-and-write"),
            Some(c as u64),
            "at {off}"
        );
    }
    // Again with the old compare data: byte 0 differs, nothing written.
    let (done, w) = aio_pair();
    aa.compare_and_write(
        Bytes::copy_from_slice(&pattern),
        Bytes::from(vec![0x11u8; 512]),
        at,
        done,
    );
    assert_eq!(wait(w).expect("compare-and-write"), Some(0));
    assert_eq!(read_b(at, 512), vec![0xC5u8; 512]);
    // A compare differing only at byte 300.
    let mut compare = vec![0xC5u8; 512];
    compare[300] = 0;
    let (done, w) = aio_pair();
    aa.compare_and_write(
        Bytes::from(compare),
        Bytes::from(vec![0x22u8; 512]),
        at,
        done,
    );
    assert_eq!(wait(w).expect("compare-and-write"), Some(300));
    assert_eq!(read_b(at, 512), vec![0xC5u8; 512]);
}

/// Two gateways' reservation stores over one object: compare-and-set on the object's version
/// (an older or a newer version is refused), and an announcement that returns only once the
/// other gateway has taken it.
fn shared_reservation_object(cluster: &Cluster) {
    let src = source(cluster, "shared");
    let a = RadosPrStore::open(&src).expect("store on gateway a");
    let b = RadosPrStore::open(&src).expect("store on gateway b");
    let (text, v0) = a.load().unwrap();
    assert_eq!(text, None, "created empty");
    assert!(v0 > 0);
    assert_eq!(b.load().unwrap(), (None, v0));
    let (tx, rx) = std::sync::mpsc::channel();
    b.subscribe(Box::new(move |text, version| {
        let _ = tx.send((text.map(str::to_string), version));
        true
    }));
    a.subscribe(Box::new(|_, _| true));

    let v1 = match a.store_if(v0, "lanes-pr 1\ngeneration 1\n").unwrap() {
        StoreResult::Stored(v) => v,
        StoreResult::Conflict => panic!("the version just read was refused"),
    };
    assert!(v1 > v0);
    assert_eq!(b.store_if(v0, "stale").unwrap(), StoreResult::Conflict);
    assert_eq!(b.store_if(v1 + 10, "ahead").unwrap(), StoreResult::Conflict);
    assert_eq!(
        b.load().unwrap(),
        (Some("lanes-pr 1\ngeneration 1\n".to_string()), v1)
    );
    a.announce(v1, "lanes-pr 1\ngeneration 1\n").unwrap();
    assert_eq!(
        rx.try_recv()
            .expect("b took the announcement before it returned"),
        (Some("lanes-pr 1\ngeneration 1\n".to_string()), v1)
    );
    // Dropping b removes its watch: the next announcement neither waits for it nor reaches it.
    drop(b);
    a.announce(v1, "lanes-pr 1\ngeneration 1\n").unwrap();
    assert!(rx.try_recv().is_err());
}
