//! The transmission phase over a real socket: unaligned I/O, the spec's error values for bad
//! requests, device errors, pipelining with out-of-order replies, disconnect and shutdown with
//! requests in flight, and concurrent overlapping writers on two connections.

mod support;

use std::sync::Arc;

use lanes_export::nbd::proto::{Command, ErrorCode};
use lanes_export::{MemoryDevice, NbdOptions};
use support::client::Client;
use support::devices::TestDevice;
use support::{pattern, On, Served};

const SIZE: u64 = 8 << 20;
const FUA: u16 = 1;
const NO_HOLE: u16 = 2;

fn memory(block: u32) -> MemoryDevice {
    MemoryDevice::new(SIZE, block).unwrap()
}

#[test]
fn unaligned_writes_read_back_and_leave_neighbours_alone() {
    let served = Served::new(memory(4096), On::Unix);
    let background = pattern(SIZE as usize, 1);
    served.dev.write_bytes(0, &background).unwrap();
    let mut model = background.clone();
    served.runtime.block_on(async {
        let mut client = Client::connect(&served.addr).await;
        for (offset, len, seed) in [
            (1000u64, 100usize, 2u64), // inside one block
            (4000, 200, 3),            // across a block boundary
            (8191, 8194, 4),           // two partial edges and a whole block
            (SIZE - 5, 5, 5),          // the very end
            (12288, 4096, 6),          // aligned
            (3, 1 << 20, 7),           // large, unaligned both ends
        ] {
            let data = pattern(len, seed);
            client.write(offset, &data).await;
            model[offset as usize..offset as usize + len].copy_from_slice(&data);
            let back = client.read(offset, len as u32).await;
            assert!(back[..] == data[..], "{len} bytes at {offset} read back");
        }
        // Unaligned read spanning everything touched.
        let back = client.read(999, 2 << 20).await;
        assert!(back[..] == model[999..999 + (2 << 20)]);
        client.disconnect().await;
    });
    assert!(served.dev.read_bytes(0, SIZE as usize).unwrap()[..] == model[..]);
}

#[test]
fn bad_requests_get_the_spec_errno_and_the_connection_lives_on() {
    let served = Served::new(memory(512), On::Tcp);
    served.runtime.block_on(async {
        let mut c = Client::connect(&served.addr).await;
        let cases: [(Command, u16, u64, u32, ErrorCode); 9] = [
            (Command::READ, 0, SIZE - 512, 1024, ErrorCode::EINVAL),
            (Command::READ, 0, u64::MAX - 10, 512, ErrorCode::EINVAL),
            (Command::READ, 0, 0, (32 << 20) + 1, ErrorCode::EINVAL),
            (Command::TRIM, 0, SIZE, 512, ErrorCode::EINVAL),
            (Command::WRITE_ZEROES, 0, SIZE - 1, 2, ErrorCode::ENOSPC),
            (Command::FLUSH, 0, 0, 512, ErrorCode::EINVAL),
            (Command(77), 0, 0, 0, ErrorCode::EINVAL),
            (Command::BLOCK_STATUS, 0, 0, 512, ErrorCode::EINVAL),
            (Command::READ, 1 << 2, 0, 512, ErrorCode::EINVAL), // DF without structured replies
        ];
        for (command, flags, offset, length, expected) in cases {
            let (error, data) = c.call(command, flags, offset, length, &[]).await;
            assert_eq!(error, expected, "{command:?} {length} bytes at {offset}");
            assert!(data.is_empty(), "no payload after an error reply");
        }
        // A write past the end: its payload is consumed, ENOSPC, and the stream stays in sync.
        let (error, _) = c
            .call(Command::WRITE, 0, SIZE - 100, 200, &[0xAB; 200])
            .await;
        assert_eq!(error, ErrorCode::ENOSPC);
        let (error, _) = c.call(Command::WRITE, NO_HOLE, 0, 4, b"abcd").await;
        assert_eq!(error, ErrorCode::EINVAL, "NO_HOLE is only for WRITE_ZEROES");
        // Zero-length requests are harmless.
        assert_eq!(c.call(Command::READ, 0, 0, 0, &[]).await.0, ErrorCode::OK);
        assert_eq!(c.call(Command::WRITE, 0, 0, 0, &[]).await.0, ErrorCode::OK);
        assert_eq!(
            c.call(Command::CACHE, 0, 0, 4096, &[]).await.0,
            ErrorCode::OK
        );
        c.write(SIZE - 4, b"tail").await;
        assert_eq!(&c.read(SIZE - 4, 4).await[..], b"tail");
        c.disconnect().await;
    });
    assert!(served
        .dev
        .read_bytes(SIZE - 100, 96)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn oversized_writes_and_garbage_end_the_connection() {
    let served = Served::new(memory(512), On::Unix);
    served.runtime.block_on(async {
        let mut c = Client::connect(&served.addr).await;
        // Header only: the server must not wait for 33 MiB of payload.
        c.submit(Command::WRITE, 0, 0, (32 << 20) + 512, &[]).await;
        assert!(c.conn.closed().await, "oversized write payload");

        let mut c = Client::connect(&served.addr).await;
        c.conn.send(&[0x55; 28]).await;
        assert!(c.conn.closed().await, "bad request magic");
    });
}

#[test]
fn largest_payloads_are_split_for_the_device() {
    let dev = MemoryDevice::new(64 << 20, 512)
        .unwrap()
        .with_max_io(1 << 20)
        .unwrap();
    let served = Served::new(dev, On::Unix);
    let data = pattern(32 << 20, 9);
    served.runtime.block_on(async {
        let mut c = Client::connect(&served.addr).await;
        c.write(4096, &data).await;
        let back = c.read(4096, 32 << 20).await;
        assert!(back[..] == data[..]);
    });
    let stats = served.dev.stats();
    assert!(
        stats.writes >= 32 && stats.reads >= 32,
        "split at max_io: {stats:?}"
    );
}

#[test]
fn flush_fua_trim_and_zeroes_reach_the_device() {
    let served = Served::new(memory(4096), On::Unix);
    served.dev.write_bytes(0, &[0xEE; 65536]).unwrap();
    served.runtime.block_on(async {
        let mut c = Client::connect(&served.addr).await;
        let before = served.dev.stats();
        assert_eq!(c.call(Command::FLUSH, 0, 0, 0, &[]).await.0, ErrorCode::OK);
        assert_eq!(
            c.call(Command::WRITE, FUA, 0, 4096, &[1; 4096]).await.0,
            ErrorCode::OK
        );
        assert_eq!(
            c.call(Command::TRIM, 0, 8192, 8192, &[]).await.0,
            ErrorCode::OK
        );
        assert_eq!(
            c.call(Command::WRITE_ZEROES, NO_HOLE | FUA, 20000, 10000, &[])
                .await
                .0,
            ErrorCode::OK
        );
        let after = served.dev.stats();
        assert_eq!(after.flushes, before.flushes + 1);
        assert_eq!(
            after.fua_writes,
            before.fua_writes + 1 + 2,
            "FUA write + 2 zeroed edges"
        );
        assert_eq!(after.trims, before.trims + 1);
        assert_eq!(after.write_zeroes, before.write_zeroes + 1);
        let back = c.read(16384, 16384).await;
        assert!(back[..20000 - 16384].iter().all(|&b| b == 0xEE));
        assert!(back[20000 - 16384..30000 - 16384].iter().all(|&b| b == 0));
        assert!(
            back[30000 - 16384..].iter().all(|&b| b == 0xEE),
            "zeroing stops at 30000"
        );
    });
}

#[test]
fn device_errors_are_eio() {
    let served = Served::new(memory(512), On::Unix);
    served.runtime.block_on(async {
        let mut c = Client::connect(&served.addr).await;
        served.dev.set_failing(true);
        assert_eq!(
            c.call(Command::READ, 0, 0, 512, &[]).await.0,
            ErrorCode::EIO
        );
        assert_eq!(
            c.call(Command::WRITE, 0, 100, 3, b"abc").await.0,
            ErrorCode::EIO
        );
        assert_eq!(c.call(Command::FLUSH, 0, 0, 0, &[]).await.0, ErrorCode::EIO);
        served.dev.set_failing(false);
        c.write(100, b"abc").await;
        assert_eq!(&c.read(100, 3).await[..], b"abc");
    });
}

fn gated() -> Served<TestDevice> {
    let dev = TestDevice::new(memory(512), Some(0), false);
    Served::with_options(Arc::new(dev), On::Unix, NbdOptions::default())
}

#[test]
fn pipelined_requests_complete_out_of_order() {
    let served = gated();
    served
        .dev
        .inner
        .write_bytes(0, &pattern(1 << 20, 3))
        .unwrap();
    served.runtime.block_on(async {
        let mut c = Client::connect(&served.addr).await;
        let stuck = c.submit(Command::READ, 0, 0, 512, &[]).await;
        let mut others = Vec::new();
        for i in 1..=100u64 {
            others.push(c.submit(Command::READ, 0, i * 4096, 512, &[]).await);
        }
        // Everything behind the stuck read is answered first.
        for _ in 0..100 {
            let (cookie, error, data) = c.reply().await;
            assert_ne!(cookie, stuck, "the gated read cannot have finished");
            assert_eq!(error, ErrorCode::OK);
            assert_eq!(data.len(), 512);
            others.retain(|&c| c != cookie);
        }
        assert!(others.is_empty(), "every other request answered once");
        served.dev.open_gate();
        let (cookie, error, data) = c.reply().await;
        assert_eq!((cookie, error), (stuck, ErrorCode::OK));
        assert!(data[..] == served.dev.inner.read_bytes(0, 512).unwrap()[..]);
    });
}

#[test]
fn disconnect_and_shutdown_answer_requests_in_flight() {
    let mut served = gated();
    let flushes_before;
    {
        let runtime = &served.runtime;
        let dev = Arc::clone(&served.dev);
        let addr = served.addr.clone();
        runtime.block_on(async {
            // NBD_CMD_DISC behind a stuck read: the read is still answered, then EOF.
            let mut c = Client::connect(&addr).await;
            let stuck = c.submit(Command::READ, 0, 0, 512, &[]).await;
            c.submit(Command::DISC, 0, 0, 0, &[]).await;
            tokio::task::yield_now().await;
            dev.open_gate();
            let (cookie, error, _) = c.reply().await;
            assert_eq!((cookie, error), (stuck, ErrorCode::OK));
            assert!(c.conn.closed().await);
        });
        flushes_before = served.dev.inner.stats().flushes;
    }
    // Shutdown with a client connected: in-flight work finishes, the client sees EOF, the
    // device is flushed once more, and the socket file is removed.
    let mut client = served
        .runtime
        .block_on(async { Client::connect(&served.addr).await });
    served
        .runtime
        .block_on(async { client.write(512, b"last words").await });
    served.stop().expect("serve returns cleanly");
    assert!(served.runtime.block_on(client.conn.closed()));
    assert_eq!(served.dev.inner.stats().flushes, flushes_before + 1);
    assert!(!served.socket_path().unwrap().exists());
    assert_eq!(
        &served.dev.inner.read_bytes(512, 10).unwrap()[..],
        b"last words"
    );
}

/// Two connections write overlapping unaligned ranges at the same time, round after round.
/// With the range lock, bytes only one writer covered are that writer's, and every block of
/// the overlap is wholly one writer's; without it, read-modify-write loses updates.
#[test]
fn concurrent_overlapping_unaligned_writers_never_tear_a_block() {
    let dev = TestDevice::new(memory(4096), None, true);
    let served = Served::with_options(Arc::new(dev), On::Unix, NbdOptions::default());
    let block = 4096usize;
    served.runtime.block_on(async {
        let mut a = Client::connect(&served.addr).await;
        let mut b = Client::connect(&served.addr).await;
        let mut seed = 0x1234_5678_u64;
        let mut next = move |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        for round in 0..200u64 {
            let base = next(64) * 4 * block as u64;
            let (a0, a1) = (
                base + next(3 * block as u64),
                base + 3 * block as u64 + next(block as u64),
            );
            let (b0, b1) = (
                base + next(2 * block as u64),
                base + 2 * block as u64 + next(2 * block as u64),
            );
            let (va, vb) = ((round * 2 % 250) as u8 + 1, (round * 2 % 250) as u8 + 2);
            let data_a = vec![va; (a1 - a0) as usize];
            let data_b = vec![vb; (b1 - b0) as usize];
            let ca = a.submit(Command::WRITE, 0, a0, data_a.len() as u32, &data_a);
            let cb = b.submit(Command::WRITE, 0, b0, data_b.len() as u32, &data_b);
            tokio::join!(ca, cb);
            let (ra, rb) = tokio::join!(a.reply(), b.reply());
            assert_eq!((ra.1, rb.1), (ErrorCode::OK, ErrorCode::OK));

            let lo = a0.min(b0);
            let hi = a1.max(b1);
            let got = served.dev.inner.read_bytes(lo, (hi - lo) as usize).unwrap();
            for pos in lo..hi {
                let byte = got[(pos - lo) as usize];
                let in_a = (a0..a1).contains(&pos);
                let in_b = (b0..b1).contains(&pos);
                match (in_a, in_b) {
                    (true, false) => assert_eq!(byte, va, "round {round}: A-only byte {pos} lost"),
                    (false, true) => assert_eq!(byte, vb, "round {round}: B-only byte {pos} lost"),
                    (true, true) => assert!(byte == va || byte == vb),
                    (false, false) => {}
                }
            }
            // Within each block, the overlap is all A's or all B's.
            let (o0, o1) = (a0.max(b0), a1.min(b1));
            let mut pos = o0;
            while pos < o1 {
                let block_end = ((pos / block as u64) + 1) * block as u64;
                let end = block_end.min(o1);
                let part = &got[(pos - lo) as usize..(end - lo) as usize];
                assert!(
                    part.iter().all(|&x| x == part[0]),
                    "round {round}: block at {} torn between writers",
                    pos / block as u64 * block as u64
                );
                pos = end;
            }
        }
    });
}

/// With at most 4 requests in flight, a fifth waits behind 4 stuck ones (it would be answered
/// at once otherwise, see `pipelined_requests_complete_out_of_order`).
#[test]
fn requests_in_flight_are_bounded() {
    let dev = TestDevice::new(memory(512), Some(0), false);
    let options = NbdOptions {
        max_in_flight: 4,
        ..NbdOptions::default()
    };
    let served = Served::with_options(Arc::new(dev), On::Unix, options);
    served.runtime.block_on(async {
        let mut c = Client::connect(&served.addr).await;
        let mut stuck = Vec::new();
        for _ in 0..4 {
            stuck.push(c.submit(Command::READ, 0, 0, 512, &[]).await);
        }
        let free = c.submit(Command::READ, 0, 4096, 512, &[]).await;
        let early = tokio::time::timeout(std::time::Duration::from_millis(300), c.reply()).await;
        assert!(
            early.is_err(),
            "a fifth request ran while four were in flight"
        );
        served.dev.open_gate();
        let mut answered = Vec::new();
        for _ in 0..5 {
            let (cookie, error, _) = c.reply().await;
            assert_eq!(error, ErrorCode::OK);
            answered.push(cookie);
        }
        answered.sort_unstable();
        stuck.push(free);
        assert_eq!(answered, stuck);
    });
}
