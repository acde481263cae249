//! A fake target that logs the initiator in and then answers its first command with hostile
//! PDUs: the session must turn each into an error (or a clean result), never a panic or a hang.

use bytes::{Bytes, BytesMut};
use iscsi_proto::pdu::*;
use iscsi_proto::Framer;
use lanes_initiator::{Error, LoginOptions, Session};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TARGET: &str = "iqn.2026-01.test.lanes:fake";

async fn next_pdu(sock: &mut TcpStream, buf: &mut BytesMut, framer: &Framer) -> Option<Pdu> {
    loop {
        if let Ok(Some(p)) = framer.decode(buf) {
            return Some(p);
        }
        if sock.read_buf(buf).await.ok()? == 0 {
            return None;
        }
    }
}

fn data_in(itt: u32, offset: u32, data: &[u8], status: bool) -> Pdu {
    Pdu::DataIn(DataIn {
        final_bit: status,
        acknowledge: false,
        overflow: false,
        underflow: false,
        status_present: status,
        status: 0,
        lun: 0,
        itt,
        ttt: RESERVED_TAG,
        stat_sn: 1,
        exp_cmd_sn: 2,
        max_cmd_sn: 9,
        data_sn: 0,
        buffer_offset: offset,
        residual: 0,
        data: Bytes::copy_from_slice(data),
    })
}

/// Serves one connection: login straight to full feature phase, then `answer(command)` bytes.
async fn fake_target(answer: fn(u32) -> Vec<u8>) -> std::net::SocketAddr {
    fake_target_in_chunks(answer, usize::MAX).await
}

/// As `fake_target`, the answer written `chunk` bytes at a time, each flushed before the next:
/// the initiator sees PDUs whose headers have come and whose data is still on its way.
async fn fake_target_in_chunks(answer: fn(u32) -> Vec<u8>, chunk: usize) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.expect("accept");
        let framer = Framer::default();
        let mut buf = BytesMut::new();
        let Some(Pdu::LoginRequest(req)) = next_pdu(&mut sock, &mut buf, &framer).await else {
            return;
        };
        let resp = Pdu::LoginResponse(LoginResponse {
            transit: true,
            continue_bit: false,
            csg: 0,
            nsg: 3,
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih: 5,
            itt: req.itt,
            stat_sn: 0,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: req.cmd_sn + 8,
            status_class: 0,
            status_detail: 0,
            data: Bytes::new(),
        });
        let _ = sock.write_all(&framer.encode_to_vec(&resp)).await;
        while let Some(p) = next_pdu(&mut sock, &mut buf, &framer).await {
            if let Pdu::ScsiCommand(c) = p {
                for part in answer(c.itt).chunks(chunk) {
                    if sock.write_all(part).await.is_err() || sock.flush().await.is_err() {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            }
        }
    });
    addr
}

fn bytes_of(pdus: &[Pdu]) -> Vec<u8> {
    let f = Framer::default();
    pdus.iter().flat_map(|p| f.encode_to_vec(p)).collect()
}

async fn read_with(answer: fn(u32) -> Vec<u8>) -> Result<Bytes, Error> {
    let addr = fake_target(answer).await;
    let s = Session::login(addr, TARGET, &LoginOptions::new("iqn.2026-01.test.lanes:i"))
        .await
        .expect("login to the fake target");
    tokio::time::timeout(Duration::from_secs(10), s.read(0, 8))
        .await
        .expect("no hang")
}

#[tokio::test]
async fn data_in_beyond_the_buffer() {
    let r = read_with(|itt| bytes_of(&[data_in(itt, 4000, &[1; 512], true)])).await;
    assert!(r.is_err(), "{r:?}");
}

#[tokio::test]
async fn data_in_for_an_unknown_task() {
    let r = read_with(|itt| bytes_of(&[data_in(itt ^ 0x55, 0, &[1; 512], true)])).await;
    assert!(r.is_err(), "{r:?}");
}

#[tokio::test]
async fn garbage_bytes() {
    let r = read_with(|_| vec![0xff; 200]).await;
    assert!(r.is_err(), "{r:?}");
}

#[tokio::test]
async fn r2t_for_a_read() {
    let r = read_with(|itt| {
        bytes_of(&[Pdu::R2t(R2t {
            lun: 0,
            itt,
            ttt: 1,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 9,
            r2t_sn: 0,
            buffer_offset: 0,
            desired_length: 1 << 30,
        })])
    })
    .await;
    assert!(r.is_err(), "{r:?}");
}

#[tokio::test]
async fn sense_length_longer_than_the_segment() {
    let r = read_with(|itt| {
        bytes_of(&[Pdu::ScsiResponse(ScsiResponse {
            bidi_overflow: false,
            bidi_underflow: false,
            overflow: false,
            underflow: false,
            response: 0,
            status: 2,
            itt,
            snack_tag: 0,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 9,
            exp_data_sn: 0,
            bidi_residual: 0,
            residual: 0,
            data: Bytes::from_static(&[0x03, 0xe8, 0x70, 0, 0x05]),
        })])
    })
    .await;
    assert!(matches!(r, Err(Error::Scsi { status: 2, .. })), "{r:?}");
}

#[tokio::test]
async fn split_data_in_is_reassembled() {
    let r = read_with(|itt| {
        bytes_of(&[
            data_in(itt, 2048, &[2; 2048], false),
            data_in(itt, 0, &[1; 2048], true),
        ])
    })
    .await
    .expect("read");
    assert_eq!(&r[..2048], &[1; 2048][..]);
    assert_eq!(&r[2048..], &[2; 2048][..]);
}

#[tokio::test]
async fn in_order_data_in_is_reassembled() {
    let r = read_with(|itt| {
        bytes_of(&[
            data_in(itt, 0, &[1; 1024], false),
            data_in(itt, 1024, &[2; 1024], false),
            data_in(itt, 2048, &[3; 2048], true),
        ])
    })
    .await
    .expect("read");
    assert_eq!(r.len(), 4096);
    assert_eq!((r[0], r[1024], r[2048], r[4095]), (1, 2, 3, 3));
}

/// A READ of `blocks` 512-byte blocks from a fake target that answers in `chunk`-byte writes.
async fn read_in_chunks(answer: fn(u32) -> Vec<u8>, chunk: usize, blocks: u16) -> Bytes {
    let addr = fake_target_in_chunks(answer, chunk).await;
    let s = Session::login(addr, TARGET, &LoginOptions::new("iqn.2026-01.test.lanes:i"))
        .await
        .expect("login to the fake target");
    tokio::time::timeout(Duration::from_secs(10), s.read(0, blocks.into()))
        .await
        .expect("no hang")
        .expect("read")
}

/// 300 KiB: three segments long enough to be read straight into the command's buffer.
const BIG: usize = 600 * 512;

fn big_piece(i: u8) -> Vec<u8> {
    (0..BIG / 3)
        .map(|j| i.wrapping_mul(31) ^ (j % 251) as u8)
        .collect()
}

/// Large Data-In arriving a little at a time, in order, out of order, and with a small one
/// between: whichever way each segment is read (straight into the command's buffer or through
/// the receive buffer), the READ returns the target's bytes in their places.
#[tokio::test]
async fn large_data_in_arriving_in_pieces_lands_in_place() {
    let third = (BIG / 3) as u32;
    let expected: Vec<u8> = (0..3).flat_map(big_piece).collect();
    let answers: [fn(u32) -> Vec<u8>; 3] = [
        |itt| {
            let t = (BIG / 3) as u32;
            bytes_of(&[
                data_in(itt, 0, &big_piece(0), false),
                data_in(itt, t, &big_piece(1), false),
                data_in(itt, 2 * t, &big_piece(2), true),
            ])
        },
        |itt| {
            let t = (BIG / 3) as u32;
            bytes_of(&[
                data_in(itt, 2 * t, &big_piece(2), false),
                data_in(itt, 0, &big_piece(0), false),
                data_in(itt, t, &big_piece(1), true),
            ])
        },
        |itt| {
            let t = (BIG / 3) as u32;
            let p1 = big_piece(1);
            bytes_of(&[
                data_in(itt, 0, &big_piece(0), false),
                data_in(itt, t, &p1[..100], false),
                data_in(itt, t + 100, &p1[100..], false),
                data_in(itt, 2 * t, &big_piece(2), true),
            ])
        },
    ];
    assert_eq!(third as usize * 3, BIG);
    for (n, answer) in answers.into_iter().enumerate() {
        for chunk in [1000, 65_536, usize::MAX] {
            let r = read_in_chunks(answer, chunk, (BIG / 512) as u16).await;
            assert!(r[..] == expected[..], "answer {n}, chunks of {chunk}");
        }
    }
}
