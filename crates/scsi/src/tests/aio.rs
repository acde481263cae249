//! READ and WRITE through [`LogicalUnit::submit`] on a device with asynchronous I/O whose
//! requests the test completes by hand, so every step is deterministic.

use super::*;
use blockstore::{AioCompletion, AsyncBlockIo, Extent, ReadDone};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

mod stream;

enum Queued {
    /// The buffer, where the read's bytes start in it, the offset.
    Read(BytesMut, usize, u64, AioCompletion<ReadDone>),
    Write(Vec<Bytes>, u64, AioCompletion<std::io::Result<()>>),
    Flush(AioCompletion<std::io::Result<()>>),
    Discard(u64, u64, AioCompletion<std::io::Result<()>>),
    Same(Bytes, u64, u64, AioCompletion<std::io::Result<()>>),
    Caw(
        Bytes,
        Bytes,
        u64,
        AioCompletion<std::io::Result<Option<u64>>>,
    ),
}

/// Memory whose asynchronous requests wait in a queue until [`HeldMemory::complete_all`].
struct HeldMemory {
    mem: MemoryDevice,
    queue: Mutex<Vec<Queued>>,
    flushes: AtomicUsize,
    /// Fail every request with this kind (a fenced gateway: NotConnected).
    fail: Mutex<Option<std::io::ErrorKind>>,
    /// Whether the storage does UNMAP, WRITE SAME and COMPARE AND WRITE itself.
    extended: std::sync::atomic::AtomicBool,
}

impl HeldMemory {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            mem: MemoryDevice::new(BLOCKS * 512),
            queue: Mutex::new(Vec::new()),
            flushes: AtomicUsize::new(0),
            fail: Mutex::new(None),
            extended: std::sync::atomic::AtomicBool::new(true),
        })
    }

    fn queued(&self) -> usize {
        self.queue.lock().len()
    }

    /// Completes the `i`-th queued request (a read) alone, failed with `fail` if given.
    fn complete_read(&self, i: usize, fail: Option<std::io::ErrorKind>) {
        let Queued::Read(mut buf, start, off, done) = self.queue.lock().remove(i) else {
            panic!("request {i} is not a read");
        };
        let r = match fail {
            Some(kind) => Err(std::io::Error::new(kind, "refused")),
            None => self.mem.read_at(&mut buf[start..], off),
        };
        done.complete((r, buf));
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
                Queued::Read(mut buf, start, off, done) => {
                    let r = self.mem.read_at(&mut buf[start..], off);
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
                Queued::Discard(off, len, done) => {
                    done.complete(outcome(self.mem.punch_hole(off, len)));
                }
                Queued::Same(pattern, off, len, done) => {
                    let all: Vec<u8> = pattern.iter().copied().cycle().take(len as usize).collect();
                    done.complete(outcome(self.mem.write_at(&all, off)));
                }
                Queued::Caw(compare, write, off, done) => {
                    let mut have = vec![0u8; compare.len()];
                    let r = self.mem.read_at(&mut have, off).and_then(|()| {
                        match have.iter().zip(compare.iter()).position(|(a, b)| a != b) {
                            Some(i) => Ok(Some(i as u64)),
                            None => self.mem.write_at(&write, off).map(|()| None),
                        }
                    });
                    done.complete(match fail {
                        Some(kind) => Err(std::io::Error::new(kind, "refused")),
                        None => r,
                    });
                }
            }
        }
    }
}

impl AsyncBlockIo for HeldMemory {
    fn read(&self, mut buf: BytesMut, len: usize, offset: u64, done: AioCompletion<ReadDone>) {
        // Appended to what the caller's buffer holds, as the contract says.
        let start = buf.len();
        buf.resize(start + len, 0);
        self.queue
            .lock()
            .push(Queued::Read(buf, start, offset, done));
    }
    fn write(&self, data: Vec<Bytes>, offset: u64, done: AioCompletion<std::io::Result<()>>) {
        self.queue.lock().push(Queued::Write(data, offset, done));
    }
    fn flush(&self, done: AioCompletion<std::io::Result<()>>) {
        self.queue.lock().push(Queued::Flush(done));
    }
    fn has_extended(&self) -> bool {
        self.extended.load(Ordering::SeqCst)
    }
    fn discard(&self, offset: u64, len: u64, done: AioCompletion<std::io::Result<()>>) {
        self.queue.lock().push(Queued::Discard(offset, len, done));
    }
    fn write_same(
        &self,
        pattern: Bytes,
        offset: u64,
        len: u64,
        done: AioCompletion<std::io::Result<()>>,
    ) {
        self.queue
            .lock()
            .push(Queued::Same(pattern, offset, len, done));
    }
    fn compare_and_write(
        &self,
        compare: Bytes,
        write: Bytes,
        offset: u64,
        done: AioCompletion<std::io::Result<Option<u64>>>,
    ) {
        self.queue
            .lock()
            .push(Queued::Caw(compare, write, offset, done));
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
    f.as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .map(|e| (e.outcome, e.data_in))
}

fn submit(lu: &Arc<LogicalUnit>, n: &Nexus, cdb: &[u8], data: &[u8]) -> crate::aio::Submitted {
    let segs = segments(data);
    match lu.submit(&request(n, cdb, &segs, 1 << 20), BytesMut::new(), None) {
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
        .submit(&request(&n, &read, &segs, 512), BytesMut::new(), None)
        .is_err());
    let mut out = BytesMut::new();
    let o = lu.execute(&request(&n, &read, &segs, 512), &mut out);
    assert_eq!(o.sense.expect("the power-on UA").key, 0x06);
    let beyond = cdb16(0x88, BLOCKS, 1);
    assert!(lu
        .submit(&request(&n, &beyond, &segs, 512), BytesMut::new(), None)
        .is_err());
    // A WRITE whose data-out brought nothing (expected transfer length 0) or part of a block.
    let write = cdb16(0x8a, 0, 1);
    assert!(lu
        .submit(&request(&n, &write, &segs, 0), BytesMut::new(), None)
        .is_err());
    let part = segments(&[1u8; 200]);
    assert!(lu
        .submit(&request(&n, &write, &part, 0), BytesMut::new(), None)
        .is_err());
    let tur = [0u8; 6];
    assert!(lu
        .submit(&request(&n, &tur, &segs, 0), BytesMut::new(), None)
        .is_err());
    // The UA was reported, so a plain READ takes this path now: the refusals above were
    // for their own reasons.
    assert!(lu
        .submit(&request(&n, &read, &segs, 512), BytesMut::new(), None)
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

fn ready(f: &mut crate::aio::Submitted) -> ScsiOutcome {
    match poll(f) {
        Poll::Ready((o, _)) => o,
        Poll::Pending => panic!("still pending"),
    }
}

/// UNMAP's 10-byte CDB and parameter list for `ranges` of (lba, blocks).
fn unmap_request(ranges: &[(u64, u32)]) -> ([u8; 10], Vec<u8>) {
    let mut list = vec![0u8; 8];
    for (lba, n) in ranges {
        list.extend_from_slice(&lba.to_be_bytes());
        list.extend_from_slice(&n.to_be_bytes());
        list.extend_from_slice(&[0; 4]);
    }
    let len = list.len() as u16;
    list[0..2].copy_from_slice(&(len - 2).to_be_bytes());
    list[2..4].copy_from_slice(&(len - 8).to_be_bytes());
    let mut cdb = [0u8; 10];
    cdb[0] = 0x42;
    cdb[7..9].copy_from_slice(&len.to_be_bytes());
    (cdb, list)
}

#[test]
fn unmap_sends_every_range_at_once_and_ends_when_the_last_is_done() {
    let (dev, lu) = held();
    let n = nexus(1, "iqn.a", 1);
    dev.mem.write_at(&[0xAB; 64 * 512], 0).unwrap();
    let (cdb, list) = unmap_request(&[(2, 3), (10, 4)]);
    let mut u = submit(&lu, &n, &cdb, &list);
    assert!(poll(&mut u).is_pending());
    assert_eq!(dev.queued(), 2, "both ranges at the storage at once");
    assert_eq!(stored(&dev, 2 * 512, 512), vec![0xAB; 512], "not yet");
    dev.complete_all();
    assert_eq!(ready(&mut u).status, status::GOOD);
    assert_eq!(stored(&dev, 2 * 512, 3 * 512), vec![0u8; 3 * 512]);
    assert_eq!(stored(&dev, 10 * 512, 4 * 512), vec![0u8; 4 * 512]);
    assert_eq!(
        stored(&dev, 5 * 512, 512),
        vec![0xAB; 512],
        "between the ranges"
    );
    assert_eq!(stored(&dev, 14 * 512, 512), vec![0xAB; 512], "after them");
    // A failed range fails the command.
    *dev.fail.lock() = Some(std::io::ErrorKind::Other);
    let mut u = submit(&lu, &n, &cdb, &list);
    dev.complete_all();
    assert_eq!(ready(&mut u).sense.expect("sense").key, 0x03);
}

#[test]
fn write_same_goes_to_the_storage_once_or_as_a_discard() {
    let (dev, lu) = held();
    let n = nexus(1, "iqn.a", 1);
    let block: Vec<u8> = (0..512).map(|i| (i % 7) as u8).collect();
    let mut w = submit(&lu, &n, &cdb16(0x93, 4, 8), &block);
    assert!(poll(&mut w).is_pending());
    assert!(matches!(
        dev.queue.lock()[..],
        [Queued::Same(_, 2048, 4096, _)]
    ));
    dev.complete_all();
    assert_eq!(ready(&mut w).status, status::GOOD);
    assert_eq!(stored(&dev, 4 * 512, 8 * 512), block.repeat(8));
    // UNMAP set and a block of zeros: deallocated.
    let mut cdb = cdb16(0x93, 4, 2);
    cdb[1] |= 0x08;
    let mut w = submit(&lu, &n, &cdb, &[0u8; 512]);
    assert!(matches!(
        dev.queue.lock()[..],
        [Queued::Discard(2048, 1024, _)]
    ));
    dev.complete_all();
    assert_eq!(ready(&mut w).status, status::GOOD);
    assert_eq!(stored(&dev, 4 * 512, 2 * 512), vec![0u8; 1024]);
    assert_eq!(stored(&dev, 6 * 512, 512), block);
}

#[test]
fn compare_and_write_is_the_storage_s_own_and_reports_the_first_difference() {
    let (dev, lu) = held();
    let n = nexus(1, "iqn.a", 1);
    dev.mem.write_at(&[5u8; 512], 3 * 512).unwrap();
    let mut data = vec![5u8; 512];
    data.extend_from_slice(&[6u8; 512]);
    let mut c = submit(&lu, &n, &cdb16(0x89, 3, 1), &data);
    assert!(poll(&mut c).is_pending());
    assert_eq!(dev.queued(), 1);
    dev.complete_all();
    assert_eq!(ready(&mut c).status, status::GOOD);
    assert_eq!(stored(&dev, 3 * 512, 512), vec![6u8; 512]);
    // The same again: byte 0 now differs, nothing is written.
    let mut c = submit(&lu, &n, &cdb16(0x89, 3, 1), &data);
    dev.complete_all();
    let s = ready(&mut c).sense.expect("MISCOMPARE");
    assert_eq!((s.key, s.asc, s.ascq), (0x0E, 0x1D, 0x00));
    assert_eq!(stored(&dev, 3 * 512, 512), vec![6u8; 512]);
    // With FUA the answer waits for a flush.
    let mut fua = cdb16(0x89, 3, 1);
    fua[1] |= 0x08;
    let mut again = vec![6u8; 512];
    again.extend_from_slice(&[7u8; 512]);
    let mut c = submit(&lu, &n, &fua, &again);
    dev.complete_all();
    assert!(poll(&mut c).is_pending(), "waits for the flush");
    dev.complete_all();
    assert_eq!(ready(&mut c).status, status::GOOD);
    assert_eq!(dev.flushes.load(Ordering::SeqCst), 1);
}

#[test]
fn storage_without_its_own_unmap_same_and_compare_leaves_them_to_the_full_path() {
    let (dev, lu) = held();
    let n = nexus(1, "iqn.a", 1);
    let (cdb, list) = unmap_request(&[(2, 3)]);
    let segs = segments(&list);
    assert!(lu
        .submit(&request(&n, &cdb, &segs, 0), BytesMut::new(), None)
        .is_ok());
    dev.extended.store(false, Ordering::SeqCst);
    assert!(lu
        .submit(&request(&n, &cdb, &segs, 0), BytesMut::new(), None)
        .is_err());
    dev.extended.store(true, Ordering::SeqCst);
    // Checks that fail are answered by the full path too: a COMPARE AND WRITE past the end.
    let data = vec![0u8; 1024];
    let segs = segments(&data);
    let beyond = cdb16(0x89, BLOCKS, 1);
    assert!(lu
        .submit(&request(&n, &beyond, &segs, 0), BytesMut::new(), None)
        .is_err());
}
