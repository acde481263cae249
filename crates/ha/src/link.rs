//! The peer link: two TCP connections (data, control) per session, framed with the core's
//! codec.
//!
//! Node 0 dials, node 1 accepts (a fixed rule, so two sessions never cross). Each connection
//! opens with a preamble: `"LNHA"`, the dialer's node id, the channel (0 data, 1 control), two
//! zero bytes and a session nonce that pairs the two connections of one session. The core task
//! owns the session; readers and writers are tasks that report frames and breakage tagged
//! with the session's id, so nothing from an old session is delivered after it was dropped.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use replication::{Channel, Message, NodeId};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

const MAGIC: &[u8; 4] = b"LNHA";
const PREAMBLE: usize = 16;
/// Longest wait for a preamble or a connect.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// Two connected streams of one session.
pub struct Streams {
    pub data: TcpStream,
    pub control: TcpStream,
}

/// What the link tasks report to the core task.
pub enum LinkEvent {
    Connected(Streams),
    Frame { session: u64, message: Message },
    Broken { session: u64, reason: String },
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

/// Accept sessions from the peer (node `peer_node`) forever, reporting each as `Connected`.
pub async fn accept(
    listener: TcpListener,
    peer_node: NodeId,
    events: mpsc::UnboundedSender<LinkEvent>,
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
                        if events.send(LinkEvent::Connected(Streams { data, control })).is_err() {
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

/// A running session: writers fed by `send`, readers reporting to the core task.
pub struct Session {
    pub id: u64,
    data: mpsc::UnboundedSender<Vec<u8>>,
    control: mpsc::UnboundedSender<Vec<u8>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Session {
    pub fn start(id: u64, streams: Streams, events: &mpsc::UnboundedSender<LinkEvent>) -> Session {
        let mut tasks = Vec::with_capacity(4);
        let mut channel = |stream: TcpStream| {
            let (r, w) = stream.into_split();
            let (tx, rx) = mpsc::unbounded_channel();
            tasks.push(tokio::spawn(write_frames(id, w, rx, events.clone())));
            tasks.push(tokio::spawn(read_frames(id, r, events.clone())));
            tx
        };
        let data = channel(streams.data);
        let control = channel(streams.control);
        Session {
            id,
            data,
            control,
            tasks,
        }
    }

    /// Queue an encoded frame.
    pub fn send(&self, channel: Channel, frame: Vec<u8>) {
        let tx = match channel {
            Channel::Data => &self.data,
            Channel::Control => &self.control,
        };
        // A closed writer reports the breakage itself.
        let _ = tx.send(frame);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn write_frames(
    session: u64,
    w: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    events: mpsc::UnboundedSender<LinkEvent>,
) {
    let mut w = BufWriter::with_capacity(256 << 10, w);
    while let Some(frame) = rx.recv().await {
        let mut result = w.write_all(&frame).await;
        while result.is_ok() {
            match rx.try_recv() {
                Ok(frame) => result = w.write_all(&frame).await,
                Err(_) => break,
            }
        }
        if let Err(e) = result.and(w.flush().await) {
            let _ = events.send(LinkEvent::Broken {
                session,
                reason: format!("write: {e}"),
            });
            return;
        }
    }
}

async fn read_frames(
    session: u64,
    r: tokio::net::tcp::OwnedReadHalf,
    events: mpsc::UnboundedSender<LinkEvent>,
) {
    let mut r = BufReader::with_capacity(256 << 10, r);
    let reason = loop {
        let mut len = [0u8; 4];
        if let Err(e) = r.read_exact(&mut len).await {
            break format!("read: {e}");
        }
        let n = u32::from_le_bytes(len);
        if !(8..=replication::codec::MAX_FRAME).contains(&n) {
            break format!("frame length {n} out of range");
        }
        let mut buf = BytesMut::zeroed(4 + n as usize);
        buf[..4].copy_from_slice(&len);
        if let Err(e) = r.read_exact(&mut buf[4..]).await {
            break format!("read: {e}");
        }
        let frame: Bytes = buf.freeze();
        match replication::decode(&frame) {
            Ok(Some((message, used))) if used == frame.len() => {
                if events.send(LinkEvent::Frame { session, message }).is_err() {
                    return;
                }
            }
            Ok(_) => break "frame length mismatch".to_string(),
            Err(e) => break format!("decode: {e}"),
        }
    };
    let _ = events.send(LinkEvent::Broken { session, reason });
}
