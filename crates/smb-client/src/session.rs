//! A session over one or more channels: connect (NEGOTIATE, SESSION_SETUP), bind more
//! channels to it (MS-SMB2 3.2.4.1.7, SMB2_SESSION_FLAG_BINDING), and spread requests over
//! them, each to the channel with the fewest requests in flight.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use smb_proto::auth::ntlm_client::{ClientRandom, Credentials};
use smb_proto::client::{
    Binding, ClientConnection, ClientNegotiateConfig, ClientNegotiated, SessionSetup, SetupDone,
    SetupStep,
};
use smb_proto::crypto::{Cipher, PreauthHash, SessionKeys, SigningAlgorithm, SigningKey};
use smb_proto::msg::negotiate::{
    CAP_ENCRYPTION, CAP_LARGE_MTU, CAP_LEASING, CAP_MULTI_CHANNEL, SECURITY_SIGNING_ENABLED,
    SECURITY_SIGNING_REQUIRED,
};
use smb_proto::msg::session::SESSION_FLAG_ENCRYPT_DATA;
use smb_proto::msg::{Message as _, SessionSetupRequest};
use smb_proto::Command;

use crate::channel::{Channel, Encryption, Outgoing};
use crate::error::SmbError;

/// How long a channel may stay silent with a request waiting before it is given up.
pub const DEFAULT_CHANNEL_TIMEOUT: Duration = Duration::from_secs(5);

/// How to sign in and what to ask for.
#[derive(Clone)]
pub struct ClientConfig {
    pub user: String,
    pub password: String,
    pub domain: String,
    /// Encrypt every request after SESSION_SETUP (AES-128-GCM preferred).
    pub encrypt: bool,
    pub signing_required: bool,
    /// Signing algorithms offered, most preferred first.
    pub signing: Vec<SigningAlgorithm>,
    /// Credits each channel asks to hold.
    pub credit_target: u64,
    /// A channel that answers nothing for this long while a request waits is given up (it is
    /// sent an ECHO after a quarter of it in silence); None leaves loss to TCP.
    pub channel_timeout: Option<Duration>,
    /// Requests of a lost channel are sent again on another one, flagged as replays under a
    /// raised ChannelSequence, and the lost channel is bound again once its address answers.
    pub failover: bool,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("user", &self.user)
            .field("domain", &self.domain)
            .field("encrypt", &self.encrypt)
            .finish_non_exhaustive()
    }
}

impl ClientConfig {
    pub fn new(user: &str, password: &str) -> Self {
        ClientConfig {
            user: user.to_string(),
            password: password.to_string(),
            domain: String::new(),
            encrypt: false,
            signing_required: true,
            signing: vec![SigningAlgorithm::AesGmac, SigningAlgorithm::AesCmac],
            credit_target: 1024,
            channel_timeout: Some(DEFAULT_CHANNEL_TIMEOUT),
            failover: true,
        }
    }

    fn offer(&self, client_guid: [u8; 16]) -> ClientNegotiateConfig {
        ClientNegotiateConfig {
            client_guid,
            capabilities: CAP_LARGE_MTU | CAP_MULTI_CHANNEL | CAP_LEASING | CAP_ENCRYPTION,
            signing_required: self.signing_required,
            signing: self.signing.clone(),
            ciphers: vec![Cipher::Aes128Gcm, Cipher::Aes128Ccm],
        }
    }

    fn credentials(&self) -> Credentials {
        Credentials {
            user: self.user.clone(),
            domain: self.domain.clone(),
            password: self.password.clone(),
            workstation: "LANES-BENCH".into(),
        }
    }
}

/// One channel's addresses and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelInfo {
    pub server: SocketAddr,
    pub client: SocketAddr,
    pub requests: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub credits: u64,
    pub closed: bool,
}

pub(crate) struct SessionInner {
    pub config: ClientConfig,
    pub client_guid: [u8; 16],
    pub id: u64,
    pub negotiated: ClientNegotiated,
    pub keys: SessionKeys,
    pub session_flags: u16,
    pub encryption: Option<Arc<Encryption>>,
    pub channels: parking_lot::RwLock<Vec<Arc<Channel>>>,
    next: AtomicUsize,
    /// The ChannelSequence requests carry, raised once per lost channel.
    pub channel_sequence: AtomicU16,
    /// Addresses of lost channels not yet bound again, and whether a task is binding them.
    pub lost: parking_lot::Mutex<crate::failover::Lost>,
    pub channels_lost: AtomicU64,
    pub channels_rebound: AtomicU64,
    /// Woken when a channel is bound (a request that found every channel lost waits for it).
    pub bound: tokio::sync::Notify,
}

/// An authenticated session; cheap to clone.
#[derive(Clone)]
pub struct Session {
    pub(crate) inner: Arc<SessionInner>,
}

/// A connected, negotiated channel before its SESSION_SETUP.
async fn open(
    addr: SocketAddr,
    config: &ClientConfig,
    client_guid: [u8; 16],
) -> Result<(Arc<Channel>, ClientNegotiated, PreauthHash), SmbError> {
    let ch = Channel::connect(addr, config.credit_target).await?;
    let mut conn = ClientConnection::new(config.offer(client_guid));
    let salt: [u8; 32] = rand::random();
    let body = conn
        .negotiate_body(&salt)
        .map_err(|e| SmbError::from_client(Command::Negotiate, e))?;
    let (resp, sent) = ch
        .call(Outgoing::plain(Command::Negotiate, 0, &body), true)
        .await?;
    let fail = |e| SmbError::from_client(Command::Negotiate, e);
    conn.sent_negotiate(sent.as_deref().unwrap_or(&[]))
        .map_err(fail)?;
    let neg = conn.on_negotiate_response(&resp).map_err(fail)?.clone();
    let preauth = conn
        .preauth()
        .ok_or_else(|| SmbError::Protocol("NEGOTIATE did not settle".into()))?;
    ch.set_large_mtu(neg.large_mtu());
    Ok((ch, neg, preauth))
}

/// Runs SESSION_SETUP to the end on `ch`.
async fn setup(
    ch: &Channel,
    config: &ClientConfig,
    neg: &ClientNegotiated,
    preauth: PreauthHash,
    binding: Option<Binding>,
) -> Result<SetupDone, SmbError> {
    let random = ClientRandom {
        client_challenge: rand::random(),
        session_key: rand::random(),
        now: now_filetime(),
    };
    let (mut state, mut token) =
        SessionSetup::start(config.credentials(), random, preauth, binding)
            .map_err(|e| SmbError::from_client(Command::SessionSetup, e))?;
    let mut mode = SECURITY_SIGNING_ENABLED as u8;
    if config.signing_required {
        mode |= SECURITY_SIGNING_REQUIRED as u8;
    }
    loop {
        let mut body = Vec::with_capacity(32 + token.len());
        SessionSetupRequest {
            flags: state.request_flags(),
            security_mode: mode,
            capabilities: 0,
            channel: 0,
            previous_session_id: 0,
            security_buffer: &token,
        }
        .encode(&mut body);
        let mut out = Outgoing::plain(Command::SessionSetup, state.session_id(), &body);
        out.sign = state.request_key();
        let (resp, sent) = ch.call(out, true).await?;
        state.sent(sent.as_deref().unwrap_or(&[]));
        match state
            .on_response(&resp, neg.signing, neg.cipher)
            .map_err(|e| SmbError::from_client(Command::SessionSetup, e))?
        {
            SetupStep::Send(t) => token = t,
            SetupStep::Done(done) => return Ok(*done),
        }
    }
}

impl Session {
    /// Connects to `addr`, negotiates SMB 3.1.1 and signs in.
    pub async fn connect(addr: SocketAddr, config: ClientConfig) -> Result<Session, SmbError> {
        let client_guid: [u8; 16] = rand::random();
        let (ch, neg, preauth) = open(addr, &config, client_guid).await?;
        let done = setup(&ch, &config, &neg, preauth, None).await?;
        let must_encrypt = done.session_flags & SESSION_FLAG_ENCRYPT_DATA != 0;
        let encryption = if config.encrypt || must_encrypt {
            let cipher = neg.cipher.ok_or_else(|| {
                SmbError::Protocol("encryption asked for, but the server chose no cipher".into())
            })?;
            Some(Arc::new(Encryption::new(
                cipher,
                done.keys.c2s_cipher.clone(),
                done.keys.s2c_cipher.clone(),
                done.session_id,
            )))
        } else {
            None
        };
        let _ = ch.signing.set(done.channel_signing.clone());
        if let Some(e) = &encryption {
            let _ = ch.encryption.set(e.clone());
        }
        if let Some(t) = config.channel_timeout {
            ch.watch(t);
        }
        let session = Session {
            inner: Arc::new(SessionInner {
                config,
                client_guid,
                id: done.session_id,
                negotiated: neg,
                keys: done.keys,
                session_flags: done.session_flags,
                encryption,
                channels: parking_lot::RwLock::new(vec![ch]),
                next: AtomicUsize::new(0),
                channel_sequence: AtomicU16::new(0),
                lost: Default::default(),
                channels_lost: AtomicU64::new(0),
                channels_rebound: AtomicU64::new(0),
                bound: tokio::sync::Notify::new(),
            }),
        };
        if let Some(ch) = session.inner.channels.read().first() {
            crate::failover::watch_end(&session.inner, ch);
        }
        Ok(session)
    }

    /// Opens a new connection to `addr` (same port rules as the caller's) and binds it to this
    /// session as another channel.
    pub async fn bind_channel(&self, addr: SocketAddr) -> Result<ChannelInfo, SmbError> {
        self.bind_channel_as(addr, &self.inner.config).await
    }

    /// Binds with other credentials (the server must refuse another user or a wrong password).
    pub async fn bind_channel_as(
        &self,
        addr: SocketAddr,
        config: &ClientConfig,
    ) -> Result<ChannelInfo, SmbError> {
        let s = &self.inner;
        if !s.negotiated.has(CAP_MULTI_CHANNEL) {
            return Err(SmbError::Usage(
                "the server does not offer SMB2_GLOBAL_CAP_MULTI_CHANNEL".into(),
            ));
        }
        let (ch, neg, preauth) = open(addr, config, s.client_guid).await?;
        if neg.signing != s.negotiated.signing || neg.cipher != s.negotiated.cipher {
            return Err(SmbError::Protocol(
                "the new channel negotiated another signing algorithm or cipher".into(),
            ));
        }
        let binding = Binding {
            session_id: s.id,
            session_signing: SigningKey::new(s.negotiated.signing, s.keys.signing),
        };
        let done = setup(&ch, config, &neg, preauth, Some(binding)).await?;
        let _ = ch.signing.set(done.channel_signing);
        if let Some(e) = &s.encryption {
            let _ = ch.encryption.set(e.clone());
        }
        if let Some(t) = s.config.channel_timeout {
            ch.watch(t);
        }
        s.channels.write().push(ch.clone());
        crate::failover::watch_end(&self.inner, &ch);
        s.bound.notify_waiters();
        Ok(info(&ch))
    }

    /// Takes the channel to `server` out of the session and closes its connection once the
    /// requests in flight on it are answered or fail; new requests go to the other channels.
    /// False when no such channel exists or it is the last one.
    pub fn remove_channel(&self, server: SocketAddr) -> bool {
        let mut chans = self.inner.channels.write();
        if chans.len() < 2 {
            return false;
        }
        let before = chans.len();
        chans.retain(|c| c.peer != server);
        chans.len() != before
    }

    pub fn negotiated(&self) -> &ClientNegotiated {
        &self.inner.negotiated
    }
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    pub fn encrypted(&self) -> bool {
        self.inner.encryption.is_some()
    }
    pub fn session_flags(&self) -> u16 {
        self.inner.session_flags
    }
    pub fn channels(&self) -> Vec<ChannelInfo> {
        self.inner.channels.read().iter().map(|c| info(c)).collect()
    }

    /// The live channel with the fewest requests in flight (round robin among equals).
    pub(crate) fn pick(&self) -> Result<Arc<Channel>, SmbError> {
        let chans = self.inner.channels.read();
        let n = chans.len();
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<&Arc<Channel>> = None;
        for i in 0..n {
            let Some(c) = chans.get((start + i) % n) else {
                continue;
            };
            if c.is_closed() {
                continue;
            }
            let load = c.inflight.load(Ordering::Relaxed);
            if best.is_none_or(|b| load < b.inflight.load(Ordering::Relaxed)) {
                best = Some(c);
            }
        }
        best.cloned()
            .ok_or_else(|| SmbError::Usage("every channel of the session is closed".into()))
    }

    /// How many channels were lost, and how many of those were bound again.
    pub fn failovers(&self) -> (u64, u64) {
        (
            self.inner.channels_lost.load(Ordering::Relaxed),
            self.inner.channels_rebound.load(Ordering::Relaxed),
        )
    }
}

fn info(c: &Channel) -> ChannelInfo {
    ChannelInfo {
        server: c.peer,
        client: c.local,
        requests: c.counters.requests.load(Ordering::Relaxed),
        bytes_read: c.counters.bytes_read.load(Ordering::Relaxed),
        bytes_written: c.counters.bytes_written.load(Ordering::Relaxed),
        credits: c.credits(),
        closed: c.is_closed(),
    }
}

/// Now as a FILETIME (100 ns since 1601), for the NTLMv2 response.
fn now_filetime() -> u64 {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() / 100)
        .unwrap_or(0);
    (unix as u64).saturating_add(116_444_736_000_000_000)
}
