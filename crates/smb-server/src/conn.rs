//! One task per connection: direct-TCP frames in, one write per response frame out. Inside a
//! frame: decryption, the compound chain, credits, session and signature checks, dispatch, and
//! the response chain signed per element.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use smb_proto::credits::{is_charged, CreditPolicy, CreditWindow};
use smb_proto::crypto::transform::{self, TRANSFORM_PROTOCOL_ID};

use crate::asyncop::encrypt_frame;
use smb_proto::crypto::{PreauthHash, SigningKey};
use smb_proto::header::NEXT_COMMAND_OFFSET;
use smb_proto::msg::{ErrorResponse, FileId, Message as _, Request};
use smb_proto::server::{Negotiated, SessionAuth};
use smb_proto::{
    split_compound_partial, Answer, Command, DirectTcp, Header, HeaderIds, NtStatus, RelatedIds,
    HEADER_LEN,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

mod chain;

use crate::state::{Server, Session};
use crate::stats::{ConnStats, Counters};

/// What a handler tells the chain builder. The body is already in the output buffer.
#[derive(Debug, Clone, Copy)]
pub struct Reply {
    pub status: NtStatus,
    /// The FileId a following related request inherits.
    pub file_id: Option<FileId>,
    /// The TreeId a TREE_CONNECT created.
    pub tree_id: Option<u32>,
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::status(NtStatus::SUCCESS)
    }
    pub fn status(status: NtStatus) -> Reply {
        Reply {
            status,
            file_id: None,
            tree_id: None,
        }
    }
}

/// A handler's answer: a reply, an error (the chain builder writes an ERROR body), the request
/// goes asynchronous, or the connection must end.
pub enum Outcome {
    Reply(Reply),
    Error(NtStatus),
    /// Went async with this AsyncId (an interim STATUS_PENDING is sent).
    Pending(u64),
    Disconnect(&'static str),
}

impl From<Result<Reply, NtStatus>> for Outcome {
    fn from(r: Result<Reply, NtStatus>) -> Self {
        match r {
            Ok(r) => Outcome::Reply(r),
            Err(s) => Outcome::Error(s),
        }
    }
}

/// A channel: this connection's binding to a session, with its own signing key.
pub struct Channel {
    pub session: Arc<Session>,
    pub signing: SigningKey,
}

/// A SESSION_SETUP exchange in progress on this connection.
pub struct PendingAuth {
    pub auth: SessionAuth,
    pub preauth: PreauthHash,
    /// The session being bound, for a binding exchange.
    pub binding: Option<Arc<Session>>,
}

/// An async request waiting (CHANGE_NOTIFY, a CREATE waiting for break acknowledgments).
pub struct AsyncOp {
    pub async_id: u64,
    pub header: Header,
    pub session_id: u64,
    /// The handle a CHANGE_NOTIFY watches (its CLOSE ends it); None for a CREATE.
    pub file_id: Option<FileId>,
    /// Set by whoever answers it first (CANCEL, CLOSE, a change event).
    pub done: Arc<std::sync::atomic::AtomicBool>,
    pub encrypted: bool,
    /// The answer when `file_id`'s handle is closed first (NOTIFY_CLEANUP for CHANGE_NOTIFY,
    /// RANGE_NOT_LOCKED for a blocking LOCK).
    pub on_close: NtStatus,
    /// Wakes the task that would answer it (a blocking LOCK) once someone else has.
    pub wake: Option<Arc<tokio::sync::Notify>>,
}

pub struct Conn {
    pub server: Arc<Server>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub negotiated: Option<Negotiated>,
    pub preauth: PreauthHash,
    pub window: CreditWindow,
    pub channels: HashMap<u64, Channel>,
    pub pending_auth: HashMap<u64, PendingAuth>,
    pub async_ops: Vec<AsyncOp>,
    next_async: u64,
    /// Frames queued besides the response being built (async completions).
    pub extra: Vec<Vec<u8>>,
    /// Set by SESSION_SETUP: the SessionId its response carries.
    pub setup_session_id: Option<u64>,
    /// Sessions logged off in the frame being answered; their channels go once it is signed.
    pub logged_off: Vec<u64>,
    /// This connection's writer.
    pub tx: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    /// This connection's counters, listed by the server and by the sessions it is a channel of.
    pub stats: Arc<ConnStats>,
}

/// Serves one TCP connection until the peer leaves or breaks the protocol.
/// A client that went silent (a channel whose path is black-holed, a host that died) is
/// found by TCP keep-alive after an idle minute and four unanswered probes 10 s apart,
/// and data left unacknowledged for 90 s ends the connection: its session goes on through
/// its other channels, and `lanes status` stops listing a dead one.
fn watch_peer(stream: &TcpStream, peer: SocketAddr) {
    use nix::sys::socket::{setsockopt, sockopt};
    let set = || -> nix::Result<()> {
        setsockopt(stream, sockopt::KeepAlive, &true)?;
        setsockopt(stream, sockopt::TcpKeepIdle, &60)?;
        setsockopt(stream, sockopt::TcpKeepInterval, &10)?;
        setsockopt(stream, sockopt::TcpKeepCount, &4)?;
        setsockopt(stream, sockopt::TcpUserTimeout, &90_000)
    };
    if let Err(e) = set() {
        tracing::debug!(peer = %peer, "SMB connection: keep-alive not set: {e}");
    }
}

pub async fn serve_connection(server: Arc<Server>, stream: TcpStream, peer: SocketAddr) {
    let local = stream.local_addr().unwrap_or(peer);
    let _ = stream.set_nodelay(true);
    watch_peer(&stream, peer);
    let stats = Arc::new(ConnStats::new(server.new_id(), peer, local));
    server.conns.insert(stats.clone());
    Counters::bump(&server.counters.connections);
    let (mut rd, mut wr) = stream.into_split();
    // The writer: response frames in order, and frames other tasks send this connection
    // (oplock break notifications, completions of async requests).
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let writer_stats = stats.clone();
    let writer = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            // An empty frame is the reader's goodbye: the writer ends, and senders elsewhere
            // (break notifications) see this connection closed.
            if frame.is_empty() {
                break;
            }
            if let Err(e) = wr.write_all(&frame).await {
                tracing::debug!(peer = %peer, "SMB write: {e}");
                break;
            }
            ConnStats::add(&writer_stats.bytes_out, frame.len() as u64);
        }
    });
    let mut conn = Conn {
        server,
        peer,
        local,
        negotiated: None,
        preauth: PreauthHash::default(),
        window: CreditWindow::new(CreditPolicy {
            max_outstanding: 8192,
            max_window: 16384,
        }),
        channels: HashMap::new(),
        pending_auth: HashMap::new(),
        async_ops: Vec::new(),
        next_async: 1,
        extra: Vec::new(),
        setup_session_id: None,
        logged_off: Vec::new(),
        tx: tx.clone(),
        stats,
    };
    let framer = DirectTcp::default();
    let mut buf = Vec::new();
    let reason = loop {
        let mut prefix = [0u8; 4];
        if let Err(e) = rd.read_exact(&mut prefix).await {
            break format!("read: {e}");
        }
        if prefix[0] != 0 {
            break format!("frame type byte {:#x}", prefix[0]);
        }
        let len =
            usize::from(prefix[1]) << 16 | usize::from(prefix[2]) << 8 | usize::from(prefix[3]);
        if len > framer.max_frame || len < 4 {
            break format!("frame of {len} bytes");
        }
        buf.resize(len, 0);
        if let Err(e) = rd.read_exact(&mut buf).await {
            break format!("read: {e}");
        }
        ConnStats::add(&conn.stats.bytes_in, len as u64 + 4);
        let handled = conn.handle_frame(&mut buf).await;
        conn.stats.credits.store(
            conn.window.outstanding(),
            std::sync::atomic::Ordering::Relaxed,
        );
        match handled {
            Ok(Some(out)) if !out.is_empty() => {
                if tx.send(out).is_err() {
                    break "writer gone".to_string();
                }
            }
            Ok(_) => {}
            Err(why) => break why.to_string(),
        }
        for f in std::mem::take(&mut conn.extra) {
            let _ = tx.send(f);
        }
    };
    tracing::debug!(peer = %conn.peer, "SMB connection closed: {reason}");
    conn.teardown();
    conn.server.conns.remove(conn.stats.id);
    drop(conn);
    let _ = tx.send(Vec::new());
    drop(tx);
    // Frames already queued (an answer before a disconnect) still go out.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
}

/// Fills in the 4-byte direct-TCP prefix of a frame built with 4 reserved bytes.
pub fn set_prefix(out: &mut [u8]) {
    let len = out.len().saturating_sub(4);
    if let Some(p) = out.get_mut(..4) {
        p.copy_from_slice(&((len as u32) & 0x00FF_FFFF).to_be_bytes());
    }
}

struct Built {
    start: usize,
    key: Option<SigningKey>,
}

impl Conn {
    pub fn new_async_id(&mut self) -> u64 {
        let id = self.next_async;
        self.next_async += 1;
        id
    }

    /// Every channel of this connection goes; a session whose last channel this was ends, and
    /// its opens close.
    fn teardown(&mut self) {
        for op in &self.async_ops {
            op.done.store(true, std::sync::atomic::Ordering::Release);
            if let Some(w) = &op.wake {
                w.notify_one();
            }
        }
        for (id, ch) in self.channels.drain() {
            let last = {
                let mut st = ch.session.state.lock();
                st.channels = st.channels.saturating_sub(1);
                st.channel_stats.retain(|c| c.id != self.stats.id);
                st.channels == 0
            };
            if last {
                crate::session::end_session(&self.server, &ch.session, true);
                self.server.remove_session(id);
            } else if !ch.session.closed.load(std::sync::atomic::Ordering::Relaxed) {
                Counters::bump(&self.server.counters.channels_lost);
                Counters::bump(&ch.session.channels_lost);
                tracing::info!(peer = %self.peer, "SMB channel of session {id:#x} lost; the session goes on");
            }
        }
    }

    async fn handle_frame(&mut self, frame: &mut [u8]) -> Result<Option<Vec<u8>>, &'static str> {
        if frame.starts_with(&TRANSFORM_PROTOCOL_ID) {
            return self.handle_transform(frame).await;
        }
        if smb_proto::smb1::is_smb1(frame) {
            return self.handle_smb1(frame).map(Some);
        }
        // A chain whose first element is marked related: every element fails with
        // INVALID_PARAMETER (the first for the flag, the related rest inherit its status).
        if Header::decode(frame).is_ok_and(|h| h.flags.is_related()) {
            let mut copy = frame.to_vec();
            if let Some(f) = copy.get_mut(smb_proto::header::FLAGS_OFFSET) {
                *f &= !(smb_proto::header::Flags::RELATED_OPERATIONS as u8);
            }
            return self
                .handle_chain(&copy, None, Some(NtStatus::INVALID_PARAMETER))
                .await
                .map(Some);
        }
        self.handle_chain(frame, None, None).await.map(Some)
    }

    async fn handle_transform(
        &mut self,
        frame: &mut [u8],
    ) -> Result<Option<Vec<u8>>, &'static str> {
        let th = transform::TransformHeader::decode(frame).map_err(|_| "bad transform header")?;
        let ch = self
            .channels
            .get(&th.session_id)
            .ok_or("transform for an unknown session")?;
        let session = ch.session.clone();
        let cipher = session
            .cipher
            .ok_or("transform without a negotiated cipher")?;
        let (_, plain) = transform::decrypt(cipher, session.keys.c2s_cipher.as_bytes(), frame)
            .map_err(|_| "transform does not decrypt")?;
        if !self
            .stats
            .encrypted
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::debug!(peer = %self.peer, cipher = crate::stats::cipher_name(Some(cipher)), "SMB connection encrypted");
        }
        let mut out = self.handle_chain(plain, Some(&session), None).await?;
        // Async completions queued meanwhile (a CANCEL's answer) go out encrypted too.
        for f in std::mem::take(&mut self.extra) {
            if let Some(body) = f.get(4..).filter(|b| !b.is_empty()) {
                let sealed = encrypt_frame(&session, body.to_vec())?;
                self.extra.push(sealed);
            }
        }
        if out.len() <= 4 {
            // Only CANCELs: nothing to answer now.
            return Ok(None);
        }
        let body = out.split_off(4);
        encrypt_frame(&session, body).map(Some)
    }

    fn handle_smb1(&mut self, frame: &[u8]) -> Result<Vec<u8>, &'static str> {
        if self.negotiated.is_some() {
            return Err("SMB1 after NEGOTIATE");
        }
        let dialects = smb_proto::smb1::negotiate_dialects(frame).map_err(|_| "SMB1 message")?;
        let cfg = crate::session::negotiate_config(&self.server);
        let answer =
            smb_proto::server::dialect::smb1_answer(&dialects, cfg.min_dialect, cfg.max_dialect);
        if answer == smb_proto::server::Smb1Answer::Refuse {
            return Err("SMB1 negotiate without a dialect the server speaks");
        }
        self.window
            .consume(0, 0, 0, false)
            .map_err(|_| "SMB1 negotiate credit")?;
        let credits = self.window.grant(1);
        let hint = smb_proto::auth::spnego::negotiate_hint();
        let now = crate::wire::now_filetime();
        let resp = if answer == smb_proto::server::Smb1Answer::Smb202 {
            // Only "SMB 2.002" fits: the connection is negotiated here (MS-SMB2 3.3.5.3.1).
            let (n, resp) = smb_proto::server::negotiate_smb1_202(&cfg, now, &hint);
            self.stats
                .dialect
                .store(n.dialect, std::sync::atomic::Ordering::Relaxed);
            self.negotiated = Some(n);
            resp
        } else {
            smb_proto::server::wildcard_response(&cfg, now, &hint)
        };
        let mut blank = [0u8; HEADER_LEN];
        blank[..4].copy_from_slice(&smb_proto::header::PROTOCOL_ID);
        blank[4] = 64;
        let mut h = Header::decode(&blank).map_err(|_| "header")?;
        h.flags.0 = smb_proto::header::Flags::SERVER_TO_REDIR;
        h.credits = credits;
        let mut out = vec![0u8; 4];
        h.encode(&mut out);
        resp.encode(&mut out);
        set_prefix(&mut out);
        Ok(out)
    }

    /// The key to sign a response with, or None.
    fn response_key(
        &self,
        req: &Header,
        session_id: u64,
        status: NtStatus,
        encrypted: bool,
    ) -> Option<SigningKey> {
        if encrypted {
            return None;
        }
        let Some(ch) = self.channels.get(&session_id) else {
            // Responses to a binding exchange (interim ones and errors) are signed with the
            // session's own key.
            if let Some(bound) = self
                .pending_auth
                .get(&session_id)
                .and_then(|p| p.binding.as_ref())
            {
                return Some(SigningKey::new(bound.signing, bound.keys.signing));
            }
            // A signed request naming a session this connection is no channel of (a failed
            // binding, a request before the binding): answered with the session's key.
            if req.flags.is_signed() {
                let s = self.server.session(session_id)?;
                return Some(SigningKey::new(s.signing, s.keys.signing));
            }
            return None;
        };
        // A session ended meanwhile (LOGOFF or a failed re-authentication on another channel)
        // still answers with this channel's key.
        let final_setup = req.command == Command::SessionSetup && status == NtStatus::SUCCESS;
        if final_setup || req.flags.is_signed() || ch.session.signing_required {
            Some(ch.signing.clone())
        } else {
            None
        }
    }
}

pub use chain::Incoming;
