//! READs read in pieces ([`crate::aio::Streamed`]): each piece is handed on once it and every
//! piece before it are read, whatever order the storage completes them in.

use super::*;
use crate::aio::{Ended, ReadSink, Streamed};

/// Records what it is handed; stops taking pieces after `live` of them.
struct Recorder {
    parts: Arc<Mutex<Vec<(usize, Bytes)>>>,
    live: usize,
}

impl ReadSink for Recorder {
    fn buffer(&mut self, len: usize) -> BytesMut {
        BytesMut::with_capacity(len)
    }
    fn part(&mut self, offset: usize, data: Bytes) -> bool {
        let mut parts = self.parts.lock();
        parts.push((offset, data));
        parts.len() < self.live
    }
}

type Parts = Arc<Mutex<Vec<(usize, Bytes)>>>;

/// A READ(16) of 8 blocks at LBA 16 in pieces of 1 KiB; the sink takes `live` pieces.
fn streamed(lu: &Arc<LogicalUnit>, live: usize) -> (crate::aio::Submitted, Parts) {
    let n = nexus(1, "iqn.a", 1);
    let parts: Parts = Default::default();
    let sink = Recorder {
        parts: parts.clone(),
        live,
    };
    let stream = Streamed {
        piece: 1024,
        sink: Box::new(sink),
    };
    let cdb = cdb16(0x88, 16, 8);
    match lu.submit(&request(&n, &cdb, &[], 4096), BytesMut::new(), Some(stream)) {
        Ok(s) => (s, parts),
        Err(_) => panic!("declined"),
    }
}

fn poll_ended(f: &mut crate::aio::Submitted) -> Poll<Ended> {
    f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

fn offsets(parts: &Parts) -> Vec<usize> {
    parts.lock().iter().map(|p| p.0).collect()
}

fn stored_pattern(dev: &HeldMemory) -> Vec<u8> {
    let data: Vec<u8> = (0..4096).map(|i| (i % 241) as u8).collect();
    dev.mem.write_at(&data, 16 * 512).unwrap();
    data
}

#[test]
fn pieces_go_out_in_order_as_soon_as_those_before_them_are_read() {
    let (dev, lu) = held();
    let data = stored_pattern(&dev);
    let (mut r, parts) = streamed(&lu, usize::MAX);
    assert_eq!(dev.queued(), 4, "every piece submitted at once");
    // The third piece first: nothing can go yet.
    dev.complete_read(2, None);
    assert!(poll_ended(&mut r).is_pending());
    assert!(parts.lock().is_empty());
    // The first: it goes alone.
    dev.complete_read(0, None);
    assert!(poll_ended(&mut r).is_pending());
    assert_eq!(offsets(&parts), vec![0]);
    // The second: it and the third go.
    dev.complete_read(0, None);
    assert!(poll_ended(&mut r).is_pending());
    assert_eq!(offsets(&parts), vec![0, 1024, 2048]);
    // The last ends the command with the rest.
    dev.complete_read(0, None);
    let Poll::Ready(e) = poll_ended(&mut r) else {
        panic!("not ended")
    };
    assert_eq!(e.outcome.status, status::GOOD);
    assert_eq!(e.handed, 3072);
    let mut all: Vec<u8> = Vec::new();
    for (_, p) in parts.lock().iter() {
        all.extend_from_slice(p);
    }
    all.extend_from_slice(&e.data_in);
    assert_eq!(all, data);
}

#[test]
fn a_failed_piece_ends_the_command_after_the_pieces_before_it() {
    let (dev, lu) = held();
    stored_pattern(&dev);
    let (mut r, parts) = streamed(&lu, usize::MAX);
    dev.complete_read(0, None);
    dev.complete_read(0, Some(std::io::ErrorKind::NotConnected));
    assert!(poll_ended(&mut r).is_pending(), "waits for every piece");
    dev.complete_read(0, None);
    assert!(poll_ended(&mut r).is_pending());
    dev.complete_read(0, None);
    let Poll::Ready(e) = poll_ended(&mut r) else {
        panic!("not ended")
    };
    assert_eq!(offsets(&parts), vec![0], "nothing after the failed piece");
    assert_eq!(e.handed, 1024);
    assert!(e.data_in.is_empty());
    assert_eq!(e.outcome.status, status::CHECK_CONDITION);
    let sense = e.outcome.sense.expect("sense");
    // A fenced gateway's refusal sends the host to another path (NOT READY), as for a whole read.
    assert_eq!(sense.key, 0x02, "{sense:?}");
}

#[test]
fn a_sink_that_is_gone_gets_nothing_more_and_the_command_still_ends() {
    let (dev, lu) = held();
    stored_pattern(&dev);
    let (mut r, parts) = streamed(&lu, 1);
    dev.complete_all();
    let Poll::Ready(e) = poll_ended(&mut r) else {
        panic!("not ended")
    };
    assert_eq!(offsets(&parts), vec![0]);
    assert_eq!(e.outcome.status, status::GOOD);
}

#[test]
fn short_reads_and_reads_past_the_transfer_length_go_whole() {
    let (dev, lu) = held();
    stored_pattern(&dev);
    let n = nexus(1, "iqn.a", 1);
    for (blocks, limit) in [(2u32, 4096u32), (8, 2048)] {
        let parts: Parts = Default::default();
        let stream = Streamed {
            piece: 1024,
            sink: Box::new(Recorder {
                parts: parts.clone(),
                live: usize::MAX,
            }),
        };
        let cdb = cdb16(0x88, 16, blocks);
        let Ok(mut r) = lu.submit(
            &request(&n, &cdb, &[], limit),
            BytesMut::new(),
            Some(stream),
        ) else {
            panic!("declined")
        };
        assert_eq!(dev.queued(), 1, "{blocks} blocks: one read");
        dev.complete_all();
        let Poll::Ready(e) = poll_ended(&mut r) else {
            panic!("not ended")
        };
        assert_eq!((e.handed, e.data_in.len()), (0, blocks as usize * 512));
        assert!(parts.lock().is_empty());
    }
}

#[test]
fn with_another_command_under_way_a_read_goes_whole() {
    let (dev, lu) = held();
    stored_pattern(&dev);
    let n = nexus(1, "iqn.a", 1);
    let mut w = submit(&lu, &n, &cdb16(0x8a, 0, 1), &[5u8; 512]);
    let (mut r, parts) = streamed(&lu, usize::MAX);
    assert_eq!(dev.queued(), 2, "the write and one whole read");
    dev.complete_all();
    assert!(poll(&mut w).is_ready());
    let Poll::Ready(e) = poll_ended(&mut r) else {
        panic!("not ended")
    };
    assert_eq!((e.handed, e.data_in.len()), (0, 4096));
    assert!(parts.lock().is_empty());
}
