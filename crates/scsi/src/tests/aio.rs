//! READ and WRITE through [`LogicalUnit::submit`] on a device with asynchronous I/O whose
//! requests the test completes by hand, so every step is deterministic.

use super::*;
use blockstore::{AioCompletion, AsyncBlockIo, Extent, ReadDone};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

enum Queued {
    Read(BytesMut, u64, AioCompletion<ReadDone>),
    Write(Vec<Bytes>, u64, AioCompletion<std::io::Result<()>>),
    Flush(AioCompletion<std::io::Result<()>>),
}

/// Memory whose asynchronous requests wait in a queue until [`HeldMemory::complete_all`].
struct HeldMemory {
    mem: MemoryDevice,
    queue: Mutex<Vec<Queued>>,
    flushes: AtomicUsize,
    /// Fail every request with this kind (a fenced gateway: NotConnected).
    fail: Mutex<Option<std::io::ErrorKind>>,
}

impl HeldMemory {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            mem: MemoryDevice::new(BLOCKS * 512),
            queue: Mutex::new(Vec::new()),
            flushes: AtomicUsize::new(0),
            fail: Mutex::new(None),
        })
    }

    fn queued(&self) -> usize {
        self.queue.lock().len()
    }

    /// Completes the queued requests in order, as the storage would.
    fn complete_all(&self) {
        let queued = std::mem::take(&mut *self.queue.lock());
        let fail = *self.fail.lock();
        let outcome = |r: std::io::Result<()>| match fail {
            Some(kind) => Err(std::io::Error::new(kind, "refused")),
            None => r,
        };
        for q in queued {
            match q {
                Queued::Read(mut buf, off, done) => {
                    let r = self.mem.read_at(&mut buf, off);
                    done.complete((outcome(r), buf));
                }
                Queued::Write(data, off, done) => {
                    let bufs: Vec<&[u8]> = data.iter().map(|b| b.as_ref()).collect();
                    let r = match fail {
                        Some(_) => Ok(()),
                        None => self.mem.write_vectored_at(&bufs, off),
                    };
                    done.complete(outcome(r));
                }
                Queued::Flush(done) => {
                    self.flushes.fetch_add(1, Ordering::SeqCst);
                    done.complete(outcome(Ok(())));
                }
            }
        }
    }
}

impl AsyncBlockIo for HeldMemory {
    fn read(&self, buf: BytesMut, offset: u64, done: AioCompletion<ReadDone>) {
        self.queue.lock().push(Queued::Read(buf, offset, done));
    }
    fn write(&self, data: Vec<Bytes>, offset: u64, done: AioCompletion<std::io::Result<()>>) {
        self.queue.lock().push(Queued::Write(data, offset, done));
    }
    fn flush(&self, done: AioCompletion<std::io::Result<()>>) {
        self.queue.lock().push(Queued::Flush(done));
    }
}

impl BlockDevice for HeldMemory {
    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.mem.write_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        self.mem.write_vectored_at(bufs, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn punch_hole(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.mem.punch_hole(offset, len)
    }
    fn allocation_map(&self, offset: u64, len: u64) -> std::io::Result<Vec<Extent>> {
        self.mem.allocation_map(offset, len)
    }
    fn aio(&self) -> Option<&dyn AsyncBlockIo> {
        Some(self)
    }
}

fn stored(dev: &HeldMemory, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    dev.mem.read_at(&mut v, offset).unwrap();
    v
}

fn held() -> (Arc<HeldMemory>, Arc<LogicalUnit>) {
    let dev = HeldMemory::new();
    let tpgs = Arc::new(TargetPortGroups::one_per_port(2));
    let lu = Arc::new(LogicalUnit::new(config(dev.clone()), tpgs).unwrap());
    (dev, lu)
}

fn poll(f: &mut crate::aio::Submitted) -> Poll<(ScsiOutcome, BytesMut)> {
    f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

fn submit(lu: &Arc<LogicalUnit>, n: &Nexus, cdb: &[u8], data: &[u8]) -> crate::aio::Submitted {
    let segs = segments(data);
    match lu.submit(&request(n, cdb, &segs, 1 << 20), BytesMut::new()) {
        Ok(s) => s,
        Err(_) => panic!("declined"),
    }
}

#[test]
fn a_write_and_a_read_end_only_when_the_storage_completes_them() {
    let (dev, lu) = held();
    let n = nexus(1, "iqn.a", 1);
    assert!(lu.has_aio());
    let data: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();
    let mut w = submit(&lu, &n, &cdb16(0x8a, 8, 2), &data);
    assert!(poll(&mut w).is_pending());
    assert_eq!(dev.queued(), 1);
    assert_eq!(
        stored(&dev, 8 * 512, 1024),
        vec![0u8; 1024],
        "nothing written yet"
    );
    dev.complete_all();
    let Poll::Ready((o, _)) = poll(&mut w) else {
        panic!("still pending")
    };
    assert_eq!(o.status, status::GOOD);
    assert_eq!(
        dev.flushes.load(Ordering::SeqCst),
        0,
        "write cache on, no FUA"
    );
    let mut r = submit(&lu, &n, &cdb16(0x88, 8, 2), &[]);
    assert!(poll(&mut r).is_pending());
    dev.complete_all();
    let Poll::Ready((o, out)) = poll(&mut r) else {
        panic!("still pending")
    };
    assert_eq!(o.status, status::GOOD);
    assert_eq!(&out[..], &data[..]);
}

#[test]
fn a_fua_write_is_acknowledged_after_its_flush() {
    let (dev, lu) = held();
    let n = nexus(1, "iqn.a", 1);
    let mut fua = cdb16(0x8a, 0, 1);
    fua[1] |= 0x08;
    let mut w = submit(&lu, &n, &fua, &[7u8; 512]);
    dev.complete_all();
    assert!(poll(&mut w).is_pending(), "waits for the flush");
    assert_eq!(dev.queued(), 1);
    dev.complete_all();
    let Poll::Ready((o, _)) = poll(&mut w) else {
        panic!("still pending")
    };
    assert_eq!(o.status, status::GOOD);
    assert_eq!(dev.flushes.load(Ordering::SeqCst), 1);
}

#[test]
fn a_refused_request_reads_as_not_ready_so_hosts_use_another_path() {
    let (dev, lu) = held();
    let n = nexus(1, "iqn.a", 1);
    *dev.fail.lock() = Some(std::io::ErrorKind::NotConnected);
    let mut w = submit(&lu, &n, &cdb16(0x8a, 0, 1), &[1u8; 512]);
    dev.complete_all();
    let Poll::Ready((o, _)) = poll(&mut w) else {
        panic!("still pending")
    };
    let s = o.sense.expect("sense");
    assert_eq!((s.key, s.asc, s.ascq), (0x02, 0x04, 0x0C));
    assert_eq!(stored(&dev, 0, 512), vec![0u8; 512]);
    *dev.fail.lock() = Some(std::io::ErrorKind::Other);
    let mut r = submit(&lu, &n, &cdb16(0x88, 0, 1), &[]);
    dev.complete_all();
    let Poll::Ready((o, out)) = poll(&mut r) else {
        panic!("still pending")
    };
    assert_eq!(o.sense.expect("sense").key, 0x03, "MEDIUM ERROR");
    assert!(out.is_empty(), "no data with an error");
}

#[test]
fn unit_attentions_conflicts_and_bad_ranges_are_left_to_the_full_path() {
    let (_dev, lu) = held();
    let n = nexus(1, "iqn.a", 1);
    lu.nexus_added(&n);
    let segs = segments(&[]);
    let read = cdb16(0x88, 0, 1);
    assert!(lu
        .submit(&request(&n, &read, &segs, 512), BytesMut::new())
        .is_err());
    let mut out = BytesMut::new();
    let o = lu.execute(&request(&n, &read, &segs, 512), &mut out);
    assert_eq!(o.sense.expect("the power-on UA").key, 0x06);
    let beyond = cdb16(0x88, BLOCKS, 1);
    assert!(lu
        .submit(&request(&n, &beyond, &segs, 512), BytesMut::new())
        .is_err());
    // A WRITE whose data-out brought nothing (expected transfer length 0) or part of a block.
    let write = cdb16(0x8a, 0, 1);
    assert!(lu
        .submit(&request(&n, &write, &segs, 0), BytesMut::new())
        .is_err());
    let part = segments(&[1u8; 200]);
    assert!(lu
        .submit(&request(&n, &write, &part, 0), BytesMut::new())
        .is_err());
    let tur = [0u8; 6];
    assert!(lu
        .submit(&request(&n, &tur, &segs, 0), BytesMut::new())
        .is_err());
    // The UA was reported, so a plain READ takes this path now: the refusals above were
    // for their own reasons.
    assert!(lu
        .submit(&request(&n, &read, &segs, 512), BytesMut::new())
        .is_ok());
}

#[test]
fn a_drain_waits_for_a_submitted_command_until_the_storage_completes_it() {
    let (dev, lu) = held();
    let n = nexus(1, "iqn.a", 1);
    let mut w = submit(&lu, &n, &cdb16(0x8a, 0, 1), &[9u8; 512]);
    assert!(
        !lu.drain.wait(Duration::from_millis(20)),
        "the write is still at the storage"
    );
    dev.complete_all();
    assert!(poll(&mut w).is_ready());
    drop(w);
    assert!(lu.drain.wait(Duration::from_secs(5)));
}
