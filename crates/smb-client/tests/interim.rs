//! Interim STATUS_PENDING responses and channel removal: a proxy in front of lanes' SMB server
//! puts an unsigned async STATUS_PENDING (granting no credit) before every response, and the
//! whole session still works; a session that drops one of two channels goes on on the other.

mod common;

use common::{config, pattern, sha256, start, PASS};
use lanes_smb_client::{OpenOptions, Session};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// An interim response to `message_id`: async header, STATUS_PENDING, an empty ERROR body.
fn interim(message_id: u64, command: u16) -> Vec<u8> {
    let mut m = vec![0u8; 4];
    m.extend_from_slice(&[0xFE, b'S', b'M', b'B', 64, 0, 0, 0]);
    m.extend_from_slice(&0x0000_0103u32.to_le_bytes());
    m.extend_from_slice(&command.to_le_bytes());
    m.extend_from_slice(&0u16.to_le_bytes());
    m.extend_from_slice(&0x3u32.to_le_bytes()); // SERVER_TO_REDIR | ASYNC_COMMAND
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(&message_id.to_le_bytes());
    m.extend_from_slice(&0x77u64.to_le_bytes()); // AsyncId
    m.extend_from_slice(&[0; 8 + 16]);
    m.extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0, 0]);
    let len = (m.len() - 4) as u32;
    m[1..4].copy_from_slice(&len.to_be_bytes()[1..]);
    m
}

async fn proxy(server: std::net::SocketAddr) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (client, _) = l.accept().await.unwrap();
        let upstream = TcpStream::connect(server).await.unwrap();
        let (mut cr, mut cw) = client.into_split();
        let (mut ur, mut uw) = upstream.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut cr, &mut uw).await;
        });
        loop {
            let mut prefix = [0u8; 4];
            if ur.read_exact(&mut prefix).await.is_err() {
                return;
            }
            let len = u32::from_be_bytes([0, prefix[1], prefix[2], prefix[3]]) as usize;
            let mut frame = vec![0u8; len];
            ur.read_exact(&mut frame).await.unwrap();
            let mid = u64::from_le_bytes(frame[24..32].try_into().unwrap());
            let command = u16::from_le_bytes(frame[12..14].try_into().unwrap());
            cw.write_all(&interim(mid, command)).await.unwrap();
            cw.write_all(&prefix).await.unwrap();
            cw.write_all(&frame).await.unwrap();
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interim_pending_responses_are_waited_through() {
    let srv = start().await;
    let p = proxy(srv.addrs[0]).await;
    let s = Session::connect(p, config(PASS)).await.unwrap();
    let tree = s.tree_connect("127.0.0.1", "share").await.unwrap();
    let f = tree
        .open("interim.bin", OpenOptions::READ_WRITE)
        .await
        .unwrap();
    let data = pattern(1 << 20, 3);
    assert_eq!(f.write_at(0, &data).await.unwrap() as usize, data.len());
    assert_eq!(sha256(&f.read_at(0, 1 << 20).await.unwrap()), sha256(&data));
    f.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_goes_on_without_a_removed_channel() {
    let srv = start().await;
    let s = Session::connect(srv.addrs[0], config(PASS)).await.unwrap();
    s.bind_channel(srv.addrs[1]).await.unwrap();
    let tree = s.tree_connect("127.0.0.1", "share").await.unwrap();
    let f = tree.open("two.bin", OpenOptions::READ_WRITE).await.unwrap();
    f.write_at(0, b"before").await.unwrap();
    assert!(s.remove_channel(srv.addrs[1]));
    assert!(!s.remove_channel(srv.addrs[0]), "the last channel stays");
    assert_eq!(s.channels().len(), 1);
    for i in 0..8u64 {
        f.write_at(i * 4096, &[i as u8; 4096]).await.unwrap();
    }
    assert_eq!(
        &f.read_at(7 * 4096, 4096).await.unwrap()[..],
        &[7u8; 4096][..]
    );
    let c = &s.channels()[0];
    assert_eq!(c.server, srv.addrs[0]);
}
