//! The peer link: two TCP connections (data, control) per session, framed with the core's
//! codec.
//!
//! Node 0 dials, node 1 accepts (a fixed rule, so two sessions never cross). Each connection
//! opens with a preamble: `"LNHA"`, the dialer's node id, the channel (0 data, 1 control), two
//! zero bytes and a session nonce that pairs the two connections of one session. Dialing and
//! accepting run as tasks that hand each new pair of connections to the core task, which then
//! owns the session and reads and writes its sockets itself ([`session`]): nothing from an old
//! session can be delivered once it is dropped.

mod session;

pub use session::{readable, writable, Session};

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use replication::NodeId;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const MAGIC: &[u8; 4] = b"LNHA";
const PREAMBLE: usize = 16;
/// Longest wait for a preamble or a connect.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// Two connected streams of one session.
pub struct Streams {
    pub data: TcpStream,
    pub control: TcpStream,
}

fn preamble(node: NodeId, channel: u8, nonce: u64) -> [u8; PREAMBLE] {
    let mut p = [0u8; PREAMBLE];
    p[..4].copy_from_slice(MAGIC);
    p[4] = node;
    p[5] = channel;
    p[8..].copy_from_slice(&nonce.to_le_bytes());
    p
}

async fn connect_one(
    peer: SocketAddr,
    node: NodeId,
    channel: u8,
    nonce: u64,
) -> std::io::Result<TcpStream> {
    let mut s = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(peer))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    s.set_nodelay(true)?;
    s.write_all(&preamble(node, channel, nonce)).await?;
    Ok(s)
}

/// Dial the peer until both connections are up, backing off between attempts. Each attempt
/// has a nonce of its own (`nonce`, then the next ones): a data connection left over from a
/// failed attempt never pairs with the control connection of a later one.
pub async fn dial(peer: SocketAddr, node: NodeId, mut nonce: u64) -> Streams {
    let mut backoff = Duration::from_millis(20);
    loop {
        tokio::time::sleep(backoff).await;
        nonce = nonce.wrapping_add(1);
        let result = async {
            let data = connect_one(peer, node, 0, nonce).await?;
            let control = connect_one(peer, node, 1, nonce).await?;
            Ok::<_, std::io::Error>(Streams { data, control })
        }
        .await;
        match result {
            Ok(streams) => return streams,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "peer link: dial failed");
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// Accept sessions from the peer (node `peer_node`) forever, handing each pair of connections on.
pub async fn accept(
    listener: TcpListener,
    peer_node: NodeId,
    events: mpsc::UnboundedSender<Streams>,
) {
    // Half-open sessions: (nonce, channel, stream); a few at most.
    let mut pending: VecDeque<(u64, u8, TcpStream)> = VecDeque::new();
    let (tx, mut rx) = mpsc::unbounded_channel::<(u64, u8, TcpStream)>();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (mut s, from) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "peer link: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut p = [0u8; PREAMBLE];
                    let read = tokio::time::timeout(HANDSHAKE_TIMEOUT, s.read_exact(&mut p)).await;
                    let ok = matches!(read, Ok(Ok(_)))
                        && &p[..4] == MAGIC
                        && p[4] == peer_node
                        && p[5] <= 1;
                    if !ok {
                        tracing::warn!(%from, "peer link: refused a connection (bad preamble)");
                        return;
                    }
                    let _ = s.set_nodelay(true);
                    let mut nonce = [0u8; 8];
                    nonce.copy_from_slice(&p[8..]);
                    let _ = tx.send((u64::from_le_bytes(nonce), p[5], s));
                });
            }
            Some((nonce, channel, stream)) = rx.recv() => {
                let mate = pending
                    .iter()
                    .position(|(n, c, _)| *n == nonce && *c != channel);
                match mate.and_then(|i| pending.remove(i)) {
                    Some((_, other, s)) => {
                        let (data, control) = if other == 0 { (s, stream) } else { (stream, s) };
                        if events.send(Streams { data, control }).is_err() {
                            return;
                        }
                    }
                    None => {
                        // The same half twice (a nonce reused): keep the newer.
                        pending.retain(|(n, c, _)| !(*n == nonce && *c == channel));
                        pending.push_back((nonce, channel, stream));
                        while pending.len() > 4 {
                            pending.pop_front();
                        }
                    }
                }
            }
        }
    }
}
