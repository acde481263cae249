//! What a session does when one of its channels is lost (MS-SMB2 3.2.7.1): the channel is
//! taken out of the session, the session's ChannelSequence is raised, the requests that were
//! waiting on it are sent again on the remaining channels flagged as replays
//! (SMB2_FLAGS_REPLAY_OPERATION), and a task binds a new channel to the lost address once it
//! answers again.
//!
//! Why the ChannelSequence: a WRITE that was on its way through the lost channel may still
//! reach the server (it was in a queue of the path when the path went silent). Once a request
//! with the raised ChannelSequence has reached the open, the server refuses such a late write
//! (STATUS_FILE_NOT_AVAILABLE), so it cannot land over a newer one; and a replay that finds an
//! older request of the open still running is answered STATUS_FILE_NOT_AVAILABLE too, and is
//! sent again shortly, after it.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use smb_proto::{Command, Header, NtStatus};

use crate::channel::{Channel, Outgoing};
use crate::error::SmbError;
use crate::session::{Session, SessionInner};

/// STATUS_FILE_NOT_AVAILABLE: the open's ChannelSequence says wait or try again.
pub const FILE_NOT_AVAILABLE: NtStatus = NtStatus(0xC000_0467);
/// STATUS_FILE_CLOSED: a replayed CLOSE whose first copy went through.
const FILE_CLOSED: NtStatus = NtStatus(0xC000_0128);
/// How often lost addresses are tried again.
const REBIND_EVERY: Duration = Duration::from_secs(1);
/// How long after it was first sent a request may still be sent again (channels lost one after
/// another, or the server asking to wait for older requests of the open); later, its error is
/// returned.
const RETRY_FOR: Duration = Duration::from_secs(60);
/// The pause before a request the server answered STATUS_FILE_NOT_AVAILABLE is sent again.
const BUSY_PAUSE: Duration = Duration::from_millis(5);

/// Lost channels' addresses, and whether a task is binding them again.
#[derive(Debug, Default)]
pub struct Lost {
    pub addrs: Vec<SocketAddr>,
    pub rebinding: bool,
}

impl Session {
    /// Sends a signed (or encrypted) request of this session on the least busy channel;
    /// returns the response once its status is a success (or one of `ok_statuses`), and the
    /// channel that carried it. A request whose channel is lost is sent again on another.
    pub(crate) async fn call(
        &self,
        command: Command,
        tree_id: u32,
        body: &[u8],
        data: &[u8],
        payload: u64,
        ok_statuses: &[NtStatus],
    ) -> Result<(Header, Bytes, Arc<Channel>), SmbError> {
        let s = &self.inner;
        let enc = s.encryption.as_deref();
        let mut replay = false;
        let started = Instant::now();
        loop {
            let ch = match self.pick() {
                Ok(ch) => ch,
                Err(e) if !s.config.failover || started.elapsed() >= RETRY_FOR => return Err(e),
                Err(_) => {
                    // Every channel lost (each one's end hook has queued it for a rebind):
                    // wait for one to be bound again.
                    let bound = s.bound.notified();
                    if self.pick().is_err() {
                        let _ = tokio::time::timeout(REBIND_EVERY, bound).await;
                    }
                    continue;
                }
            };
            let sequence = s.channel_sequence.load(Ordering::Relaxed);
            let out = Outgoing {
                command,
                session_id: s.id,
                tree_id,
                body,
                data,
                payload,
                sign: if enc.is_some() {
                    None
                } else {
                    ch.signing.get()
                },
                encrypt: enc,
                replay,
                channel_sequence: sequence,
            };
            let retry_allowed = s.config.failover && started.elapsed() < RETRY_FOR;
            let resp = match ch.call(out, false).await {
                Ok((resp, _)) => resp,
                Err(SmbError::Closed { .. }) if retry_allowed => {
                    self.channel_lost(&ch);
                    replay = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let h = Header::decode(&resp)?;
            let status = h.nt_status();
            if status == FILE_NOT_AVAILABLE
                && retry_allowed
                && (replay || sequence != s.channel_sequence.load(Ordering::Relaxed))
            {
                // Older requests of the open are still running, or this one went out under the
                // old sequence after the raise: after them, as a replay.
                replay = true;
                tokio::time::sleep(BUSY_PAUSE).await;
                continue;
            }
            if replay && command == Command::Close && status == FILE_CLOSED {
                return Ok((h, resp, ch));
            }
            if status != NtStatus::SUCCESS && !ok_statuses.contains(&status) {
                return Err(SmbError::Status { command, status });
            }
            return Ok((h, resp, ch));
        }
    }

    fn channel_lost(&self, ch: &Arc<Channel>) {
        channel_lost(&self.inner, ch);
    }
}

/// Has the session hear of `ch` ending (given up by its watch, closed by the server).
pub(crate) fn watch_end(inner: &Arc<SessionInner>, ch: &Arc<Channel>) {
    let session = Arc::downgrade(inner);
    ch.on_end(Box::new(move |ch| {
        if let Some(inner) = session.upgrade() {
            channel_lost(&inner, ch);
        }
    }));
}

/// Takes a lost channel out of the session (once, whoever sees it first), raises the
/// ChannelSequence and has its address bound again when it answers.
fn channel_lost(s: &Arc<SessionInner>, ch: &Arc<Channel>) {
    {
        let mut chans = s.channels.write();
        let before = chans.len();
        chans.retain(|c| !Arc::ptr_eq(c, ch));
        if chans.len() == before {
            return;
        }
        // Raised before the channel is seen gone: no replay goes out under the old value.
        s.channel_sequence.fetch_add(1, Ordering::Relaxed);
    }
    s.channels_lost.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        peer = %ch.peer,
        "SMB channel lost; its requests go on the other channels as replays"
    );
    let start = {
        let mut lost = s.lost.lock();
        lost.addrs.push(ch.peer);
        !std::mem::replace(&mut lost.rebinding, true)
    };
    if start {
        tokio::spawn(rebind(Arc::downgrade(s)));
    }
}

/// Binds the lost addresses again, one attempt each per second, until none is left or the
/// session is gone.
async fn rebind(inner: std::sync::Weak<SessionInner>) {
    loop {
        tokio::time::sleep(REBIND_EVERY).await;
        let Some(inner) = inner.upgrade() else { return };
        let addrs = {
            let mut lost = inner.lost.lock();
            if lost.addrs.is_empty() {
                lost.rebinding = false;
                return;
            }
            lost.addrs.clone()
        };
        let session = Session {
            inner: inner.clone(),
        };
        let limit = crate::channel::CONNECT_TIMEOUT
            + inner
                .config
                .channel_timeout
                .unwrap_or(crate::session::DEFAULT_CHANNEL_TIMEOUT);
        for addr in addrs {
            match tokio::time::timeout(limit, session.bind_channel(addr)).await {
                Ok(Ok(_)) => {
                    inner.lost.lock().addrs.retain(|a| *a != addr);
                    inner.channels_rebound.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(peer = %addr, "SMB channel bound again");
                }
                Ok(Err(e)) => tracing::debug!(peer = %addr, "SMB channel not back yet: {e}"),
                Err(_) => tracing::debug!(peer = %addr, "SMB channel not back yet: timed out"),
            }
        }
    }
}
