//! One channel: a TCP connection carrying a session's requests. Many requests are in flight at
//! once; a reader task matches responses to waiters by MessageId, keeps interim
//! STATUS_PENDING responses' credits and waits on, checks signatures and decrypts. Senders wait
//! for credits and write each request with one vectored write (header and fixed part, then the
//! payload as it is).

use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::{Buf as _, Bytes, BytesMut};
use smb_proto::client::{check_response_signature, ClientCredits};
use smb_proto::crypto::kdf::CipherKey;
use smb_proto::crypto::transform::{decrypt, encrypt, TRANSFORM_HEADER_LEN};
use smb_proto::crypto::{Cipher, SigningKey};
use smb_proto::msg::{EchoRequest, Message as _};
use smb_proto::{
    split_compound, Command, DirectTcp, Flags, FrameKind, Header, NtStatus, HEADER_LEN,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};

use crate::error::SmbError;

/// Largest frame accepted from a server: 8 MiB of data and room for headers.
const MAX_FRAME: usize = 8 * 1024 * 1024 + 64 * 1024;
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A session's encryption keys and nonce source (shared by its channels, so nonces never
/// repeat under one key).
pub(crate) struct Encryption {
    pub cipher: Cipher,
    pub c2s: CipherKey,
    pub s2c: CipherKey,
    pub session_id: u64,
    nonce_salt: [u8; 4],
    counter: AtomicU64,
}

impl Encryption {
    pub fn new(cipher: Cipher, c2s: CipherKey, s2c: CipherKey, session_id: u64) -> Self {
        Encryption {
            cipher,
            c2s,
            s2c,
            session_id,
            nonce_salt: rand::random(),
            counter: AtomicU64::new(1),
        }
    }
    /// A unique nonce: a counter and random salt, cut to the cipher's nonce length.
    fn nonce(&self) -> [u8; 12] {
        let mut n = [0u8; 12];
        let c = self.counter.fetch_add(1, Ordering::Relaxed);
        n[..8].copy_from_slice(&c.to_le_bytes());
        n[8..].copy_from_slice(&self.nonce_salt);
        n
    }
}

/// Counters of one channel.
#[derive(Debug, Default)]
pub struct ChannelCounters {
    pub requests: AtomicU64,
    /// READ payload bytes received.
    pub bytes_read: AtomicU64,
    /// WRITE payload bytes sent.
    pub bytes_written: AtomicU64,
}

struct Waiter {
    tx: oneshot::Sender<Result<Bytes, SmbError>>,
    /// The request was signed, so a successful answer must be signed and verify.
    verify: bool,
}

struct State {
    credits: ClientCredits,
    pending: HashMap<u64, Waiter>,
    closed: Option<String>,
}

/// A request to send.
pub(crate) struct Outgoing<'a> {
    pub command: Command,
    pub session_id: u64,
    pub tree_id: u32,
    /// The encoded body (for WRITE, its fixed part only).
    pub body: &'a [u8],
    /// Bytes that follow the body on the wire (the WRITE payload).
    pub data: &'a [u8],
    /// The size the CreditCharge covers.
    pub payload: u64,
    pub sign: Option<&'a SigningKey>,
    pub encrypt: Option<&'a Encryption>,
    /// Sent again after its channel was lost (SMB2_FLAGS_REPLAY_OPERATION).
    pub replay: bool,
    /// The session's ChannelSequence (MS-SMB2 3.2.4.1.1), raised after each lost channel.
    pub channel_sequence: u16,
}

impl<'a> Outgoing<'a> {
    /// A request outside any session (NEGOTIATE, ECHO) or before its keys.
    pub fn plain(command: Command, session_id: u64, body: &'a [u8]) -> Self {
        Outgoing {
            command,
            session_id,
            tree_id: 0,
            body,
            data: &[],
            payload: 0,
            sign: None,
            encrypt: None,
            replay: false,
            channel_sequence: 0,
        }
    }
}

/// What a channel runs once when it ends.
pub(crate) type EndHook = Box<dyn Fn(&Arc<Channel>) + Send + Sync>;

pub struct Channel {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    /// The same socket, to shut it down under a blocked reader and writer when the channel is
    /// given up.
    ctl: std::net::TcpStream,
    /// When the channel was opened, and when a frame last arrived (ms after `opened`).
    opened: Instant,
    last_rx: AtomicU64,
    /// A keep-alive ECHO is in flight.
    echo_out: AtomicBool,
    /// Told once when the channel ends (its session takes it out and binds it again).
    on_end: OnceLock<EndHook>,
    me: Weak<Channel>,
    state: parking_lot::Mutex<State>,
    credit_wait: Notify,
    /// The key this channel's requests are signed and responses checked with.
    pub(crate) signing: OnceLock<SigningKey>,
    pub(crate) encryption: OnceLock<Arc<Encryption>>,
    pub(crate) inflight: AtomicUsize,
    pub counters: ChannelCounters,
    credit_target: u64,
}

impl Channel {
    /// Connects and starts the reader task.
    pub(crate) async fn connect(
        addr: SocketAddr,
        credit_target: u64,
    ) -> Result<Arc<Channel>, SmbError> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| SmbError::ConnectTimeout(addr))?
            .map_err(|source| SmbError::Connect { addr, source })?;
        stream.set_nodelay(true)?;
        // A channel given up is reset, its unsent requests dropped, rather than flushed to the
        // server whenever the path comes back.
        stream.set_zero_linger()?;
        let local = stream.local_addr()?;
        let std_stream = stream.into_std()?;
        let ctl = std_stream.try_clone()?;
        let (rd, wr) = TcpStream::from_std(std_stream)?.into_split();
        let ch = Arc::new_cyclic(|me| Channel {
            me: me.clone(),
            on_end: OnceLock::new(),
            peer: addr,
            local,
            writer: tokio::sync::Mutex::new(wr),
            ctl,
            opened: Instant::now(),
            last_rx: AtomicU64::new(0),
            echo_out: AtomicBool::new(false),
            state: parking_lot::Mutex::new(State {
                credits: ClientCredits::new(),
                pending: HashMap::new(),
                closed: None,
            }),
            credit_wait: Notify::new(),
            signing: OnceLock::new(),
            encryption: OnceLock::new(),
            inflight: AtomicUsize::new(0),
            counters: ChannelCounters::default(),
            credit_target,
        });
        tokio::spawn(read_loop(Arc::downgrade(&ch), rd));
        Ok(ch)
    }

    pub(crate) fn set_large_mtu(&self, on: bool) {
        self.state.lock().credits.set_large_mtu(on);
    }

    pub fn is_closed(&self) -> bool {
        self.state.lock().closed.is_some()
    }

    pub fn credits(&self) -> u64 {
        self.state.lock().credits.available()
    }

    /// Sends a request and waits for its final response (the whole message, header first).
    /// With `keep`, also returns the request as sent (for the preauth hash).
    pub(crate) async fn call(
        &self,
        out: Outgoing<'_>,
        keep: bool,
    ) -> Result<(Bytes, Option<Vec<u8>>), SmbError> {
        let (tx, rx) = oneshot::channel();
        // SESSION_SETUP responses are checked by the setup state machine, with the keys only
        // it knows.
        let verify =
            out.command != Command::SessionSetup && (out.sign.is_some() || out.encrypt.is_some());
        let (message_id, charge, request) = loop {
            let notified = self.credit_wait.notified();
            {
                let mut st = self.state.lock();
                if let Some(reason) = &st.closed {
                    return Err(self.closed(reason));
                }
                if let Some((id, charge)) = st.credits.take(out.payload) {
                    let request = st.credits.request_for(charge, self.credit_target);
                    st.pending.insert(id, Waiter { tx, verify });
                    break (id, charge, request);
                }
                if st.pending.is_empty() {
                    // Credits come only with responses: with none outstanding, waiting would
                    // never end.
                    return Err(SmbError::Protocol(format!(
                        "the server left {} credits, {} needed, and nothing outstanding",
                        st.credits.available(),
                        st.credits.charge(out.payload)
                    )));
                }
            }
            notified.await;
        };
        self.inflight.fetch_add(1, Ordering::Relaxed);
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let mut header = smb_proto::client::request_header(
            out.command,
            message_id,
            charge,
            request,
            out.session_id,
            out.tree_id,
        );
        header.flags.0 = if out.replay {
            Flags::REPLAY_OPERATION
        } else {
            0
        };
        header.status = u32::from(out.channel_sequence);
        let mut head = Vec::with_capacity(4 + HEADER_LEN + out.body.len());
        head.extend_from_slice(&[0; 4]);
        header.encode(&mut head);
        head.extend_from_slice(out.body);
        let sent = self.send(&mut head, &out).await;
        let kept = keep.then(|| {
            let mut v = head.get(4..).unwrap_or(&[]).to_vec();
            v.extend_from_slice(out.data);
            v
        });
        let result = match sent {
            Ok(()) => rx
                .await
                .unwrap_or_else(|_| Err(self.closed("reader stopped"))),
            Err(e) => {
                self.state.lock().pending.remove(&message_id);
                match e {
                    // A write that failed may have left part of a request on the wire: the
                    // stream is out of step and the channel is done.
                    SmbError::Io(io) => {
                        let reason = format!("send failed: {io}");
                        self.lose(&reason);
                        Err(self.closed(&reason))
                    }
                    // Refused before anything was written (too large, no cipher): the
                    // request's own error, the channel stays.
                    other => Err(other),
                }
            }
        };
        self.inflight.fetch_sub(1, Ordering::Relaxed);
        result.map(|r| (r, kept))
    }

    async fn send(&self, head: &mut [u8], out: &Outgoing<'_>) -> Result<(), SmbError> {
        let msg_len = head.len() - 4 + out.data.len();
        if let Some(e) = out.encrypt {
            let mut plain = Vec::with_capacity(msg_len);
            plain.extend_from_slice(head.get(4..).unwrap_or(&[]));
            plain.extend_from_slice(out.data);
            let nonce = e.nonce();
            let n = nonce.get(..e.cipher.nonce_len()).unwrap_or(&nonce);
            let th = encrypt(e.cipher, e.c2s.as_bytes(), n, e.session_id, &mut plain)
                .map_err(|err| SmbError::Protocol(format!("encrypt: {err}")))?;
            let total = TRANSFORM_HEADER_LEN + plain.len();
            let prefix = DirectTcp::prefix(total)
                .ok_or_else(|| SmbError::Usage("request too large".into()))?;
            let th = th.encode();
            let mut w = self.writer.lock().await;
            write_all(&mut w, &[&prefix, &th, &plain]).await?;
            return Ok(());
        }
        if let Some(key) = out.sign {
            let (_, msg) = head.split_at_mut(4);
            key.sign_parts(msg, &[out.data])
                .map_err(|e| SmbError::Protocol(format!("sign: {e}")))?;
        }
        let prefix = DirectTcp::prefix(msg_len)
            .ok_or_else(|| SmbError::Usage("request too large".into()))?;
        if let Some(p) = head.get_mut(..4) {
            p.copy_from_slice(&prefix);
        }
        let mut w = self.writer.lock().await;
        write_all(&mut w, &[head, out.data]).await?;
        Ok(())
    }

    fn closed(&self, reason: &str) -> SmbError {
        SmbError::Closed {
            peer: self.peer,
            reason: reason.to_string(),
        }
    }

    /// Gives the channel up: the socket is shut down (a blocked send or receive returns) and
    /// every request waiting on it fails with `Closed`, for the session to send again on
    /// another channel.
    pub(crate) fn lose(&self, reason: &str) {
        let _ = self.ctl.shutdown(std::net::Shutdown::Both);
        self.fail_all(reason.to_string());
    }

    fn since_rx(&self) -> Duration {
        let now = self.opened.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_rx.load(Ordering::Relaxed)))
    }

    /// Watches the channel: an ECHO when it has been silent for a quarter of `timeout`, and
    /// the channel given up when nothing at all arrives for `timeout` while a request (such
    /// as that ECHO) waits for an answer. A channel whose path went silent is found this way
    /// rather than by TCP's retransmission timeouts, which take minutes.
    pub(crate) fn watch(self: &Arc<Self>, timeout: Duration) {
        let weak = Arc::downgrade(self);
        let tick = (timeout / 4).max(Duration::from_millis(10));
        self.last_rx
            .store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let Some(ch) = weak.upgrade() else { return };
                if ch.is_closed() {
                    return;
                }
                let silent = ch.since_rx();
                let waiting = !ch.state.lock().pending.is_empty();
                if waiting && silent >= timeout {
                    let reason = format!("no answer for {} ms", silent.as_millis());
                    tracing::warn!(peer = %ch.peer, "SMB channel given up: {reason}");
                    ch.lose(&reason);
                    return;
                }
                if silent >= tick && !ch.echo_out.swap(true, Ordering::Relaxed) {
                    let echo = ch.clone();
                    tokio::spawn(async move {
                        let mut body = Vec::with_capacity(4);
                        EchoRequest.encode(&mut body);
                        let _ = echo
                            .call(Outgoing::plain(Command::Echo, 0, &body), false)
                            .await;
                        echo.echo_out.store(false, Ordering::Relaxed);
                    });
                }
            }
        });
    }

    /// Ends the channel: every waiter gets an error, and the session hears of it once.
    fn fail_all(&self, reason: String) {
        let (pending, first) = {
            let mut st = self.state.lock();
            let first = st.closed.is_none();
            st.closed.get_or_insert(reason.clone());
            (std::mem::take(&mut st.pending), first)
        };
        for (_, w) in pending {
            let _ = w.tx.send(Err(self.closed(&reason)));
        }
        self.credit_wait.notify_waiters();
        if first {
            if let (Some(hook), Some(me)) = (self.on_end.get(), self.me.upgrade()) {
                hook(&me);
            }
        }
    }

    /// Has `hook` run when the channel ends (at once if it already has).
    pub(crate) fn on_end(self: &Arc<Self>, hook: EndHook) {
        let _ = self.on_end.set(hook);
        if self.is_closed() {
            if let Some(hook) = self.on_end.get() {
                hook(self);
            }
        }
    }

    /// Takes one response message off the wire.
    fn deliver(&self, msg: Bytes, encrypted: bool) -> Result<(), SmbError> {
        let h = Header::decode(&msg)?;
        if !h.flags.is_response() {
            return Err(SmbError::Protocol("a request from the server".into()));
        }
        let waiter = {
            let mut st = self.state.lock();
            st.credits.grant(h.credits);
            let interim = h.nt_status() == NtStatus::PENDING && h.tree_id().is_none();
            if interim || h.message_id == u64::MAX {
                // An interim response (its credits count, the final one follows) or an
                // oplock/lease break notification, which this client does not ask for.
                None
            } else {
                st.pending.remove(&h.message_id)
            }
        };
        self.credit_wait.notify_waiters();
        let Some(w) = waiter else {
            return Ok(());
        };
        let result = match (w.verify && !encrypted, self.signing.get()) {
            (false, _) => Ok(msg),
            (true, Some(key)) => check_response_signature(key, &msg)
                .map(|()| msg)
                .map_err(|_| SmbError::BadSignature),
            (true, None) => Err(SmbError::BadSignature),
        };
        let _ = w.tx.send(result);
        Ok(())
    }
}

/// Writes every part with vectored writes, without allocating (at most three parts).
async fn write_all(w: &mut OwnedWriteHalf, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut left: [&[u8]; 3] = [&[], &[], &[]];
    for (slot, p) in left.iter_mut().zip(parts) {
        *slot = p;
    }
    loop {
        let [a, b, c] = left;
        if a.is_empty() && b.is_empty() && c.is_empty() {
            return Ok(());
        }
        let slices = [IoSlice::new(a), IoSlice::new(b), IoSlice::new(c)];
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        for part in left.iter_mut() {
            let take = n.min(part.len());
            *part = part.get(take..).unwrap_or(&[]);
            n -= take;
        }
    }
}

async fn read_loop(ch: Weak<Channel>, mut rd: OwnedReadHalf) {
    let reason = match read_frames(&ch, &mut rd).await {
        Ok(()) => "server closed the connection".to_string(),
        Err(e) => e.to_string(),
    };
    if let Some(ch) = ch.upgrade() {
        tracing::debug!(peer = %ch.peer, "SMB channel ends: {reason}");
        ch.fail_all(reason);
    }
}

async fn fill(rd: &mut OwnedReadHalf, buf: &mut BytesMut, want: usize) -> Result<bool, SmbError> {
    while buf.len() < want {
        if buf.capacity() - buf.len() < want - buf.len() {
            buf.reserve((want - buf.len()).max(64 * 1024));
        }
        if rd.read_buf(buf).await? == 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

async fn read_frames(ch: &Weak<Channel>, rd: &mut OwnedReadHalf) -> Result<(), SmbError> {
    let mut buf = BytesMut::with_capacity(1024 * 1024);
    let framer = DirectTcp {
        max_frame: MAX_FRAME,
    };
    loop {
        if !fill(rd, &mut buf, 4).await? {
            return Ok(());
        }
        let len = match framer.decode(buf.get(..4).unwrap_or(&[])) {
            Err(e) => return Err(e.into()),
            Ok(_) => {
                let b = buf.get(1..4).unwrap_or(&[0, 0, 0]);
                (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2])
            }
        };
        if !fill(rd, &mut buf, 4 + len).await? {
            return Ok(());
        }
        buf.advance(4);
        let mut frame = buf.split_to(len);
        let Some(ch) = ch.upgrade() else {
            return Ok(());
        };
        ch.last_rx
            .store(ch.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
        let encrypted = FrameKind::of(&frame) == FrameKind::Transform;
        if encrypted {
            let e = ch
                .encryption
                .get()
                .ok_or_else(|| {
                    SmbError::Protocol("encrypted frame on a session without keys".into())
                })?
                .clone();
            decrypt(e.cipher, e.s2c.as_bytes(), &mut frame)
                .map_err(|err| SmbError::Protocol(format!("decrypt: {err}")))?;
            frame.advance(TRANSFORM_HEADER_LEN);
        } else if FrameKind::of(&frame) != FrameKind::Smb2 {
            return Err(SmbError::Protocol("frame is not SMB2".into()));
        }
        let frame = frame.freeze();
        let elements: Vec<(usize, usize)> = split_compound(&frame)?
            .iter()
            .map(|e| (e.offset, e.bytes.len()))
            .collect();
        for (off, len) in elements {
            ch.deliver(frame.slice(off..off + len), encrypted)?;
        }
    }
}
