//! A server that answers NEGOTIATE with garbage, a truncated or oversized frame, a response for
//! another MessageId, or silence and a close: the client returns an error, never panics or
//! hangs.

use std::time::Duration;

use lanes_smb_client::{ClientConfig, Session};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A one-connection server that reads the NEGOTIATE and writes `answer`, then closes.
async fn answering(answer: Vec<u8>) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await;
        let _ = s.write_all(&answer).await;
        let _ = s.shutdown().await;
    });
    addr
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut v = vec![0, 0, 0, 0];
    v[1..4].copy_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    v.extend_from_slice(body);
    v
}

/// A response header for MessageId `mid` with `status`, then `body`.
fn response(mid: u64, status: u32, body: &[u8]) -> Vec<u8> {
    let mut h = vec![0xFE, b'S', b'M', b'B', 64, 0, 1, 0];
    h.extend_from_slice(&status.to_le_bytes());
    h.extend_from_slice(&[0, 0, 1, 0]); // NEGOTIATE, 1 credit
    h.extend_from_slice(&1u32.to_le_bytes()); // SERVER_TO_REDIR
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&mid.to_le_bytes());
    h.extend_from_slice(&[0; 8 + 8 + 16]);
    h.extend_from_slice(body);
    h
}

#[tokio::test]
async fn garbage_answers_are_errors() {
    let mut negotiate_body = vec![65, 0];
    negotiate_body.extend_from_slice(&[0xFF; 70]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("nothing", Vec::new()),
        ("frame type", vec![0x85, 0, 0, 4, 1, 2, 3, 4]),
        ("oversized frame", vec![0, 0xFF, 0xFF, 0xFF]),
        ("truncated frame", vec![0, 0, 1, 0, 0xFE, b'S']),
        ("not SMB2", framed(&[0x11; 80])),
        ("short header", framed(&[0xFE, b'S', b'M', b'B', 64, 0])),
        ("bad body", framed(&response(0, 0, &negotiate_body))),
        ("empty body", framed(&response(0, 0, &[]))),
        (
            "error status",
            framed(&response(0, 0xC000_0022, &[9, 0, 0, 0, 0, 0, 0, 0, 0])),
        ),
        ("another MessageId", framed(&response(7, 0, &[]))),
    ];
    for (what, answer) in cases {
        let addr = answering(answer).await;
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            Session::connect(addr, ClientConfig::new("u", "p")),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: hangs"));
        assert!(r.is_err(), "{what}: accepted");
    }
}

/// A NEGOTIATE response from lanes' server with its CreditResponse rewritten to 0: the client
/// cannot send SESSION_SETUP and says so instead of waiting for a credit that never comes.
#[tokio::test]
async fn a_server_that_grants_no_credit_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = lanes_smb_server::SmbConfig::new(dir.path());
    cfg.listen = vec!["127.0.0.1:0".parse().unwrap()];
    let server = lanes_smb_server::SmbServer::start(cfg, lanes_smb_server::Users::new())
        .await
        .unwrap();
    let upstream_addr = server.addrs[0];
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (client, _) = l.accept().await.unwrap();
        let upstream = tokio::net::TcpStream::connect(upstream_addr).await.unwrap();
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
            frame[14..16].copy_from_slice(&0u16.to_le_bytes());
            if cw.write_all(&prefix).await.is_err() || cw.write_all(&frame).await.is_err() {
                return;
            }
        }
    });
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        Session::connect(addr, ClientConfig::new("u", "p")),
    )
    .await
    .expect("no hang");
    let err = r.err().expect("refused");
    assert!(err.to_string().contains("credits"), "{err}");
}
