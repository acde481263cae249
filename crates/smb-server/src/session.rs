//! NEGOTIATE, SESSION_SETUP (first channel and binding), LOGOFF.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use smb_proto::auth::ntlm_server::ChallengeParams;
use smb_proto::crypto::{Cipher, SessionKeys, SigningAlgorithm, SigningKey};
use smb_proto::msg::negotiate::{
    CAP_ENCRYPTION, CAP_LARGE_MTU, CAP_LEASING, CAP_MULTI_CHANNEL, DIALECT_311,
    SECURITY_SIGNING_REQUIRED,
};
use smb_proto::msg::session::SESSION_FLAG_BINDING;
use smb_proto::msg::{
    LogoffResponse, Message as _, NegotiateRequest, SessionSetupRequest, SessionSetupResponse,
};
use smb_proto::server::binding;
use smb_proto::server::{negotiate, AuthStep, NegotiateConfig, SessionAuth};
use smb_proto::NtStatus;

use crate::conn::{Channel, Conn, Incoming, Outcome, PendingAuth, Reply};
use crate::state::{Server, Session, SessionState, MAX_CHANNELS};
use crate::stats::Counters;

/// Largest READ, WRITE and transact the server offers.
pub const MAX_IO: u32 = 8 * 1024 * 1024;

pub fn negotiate_config(server: &Server) -> NegotiateConfig {
    NegotiateConfig {
        server_guid: server.server_guid,
        // Each dialect gets what it has of these (ENCRYPTION for 3.0 and 3.0.2 only).
        capabilities: CAP_LARGE_MTU | CAP_MULTI_CHANNEL | CAP_LEASING | CAP_ENCRYPTION,
        max_transact_size: MAX_IO,
        max_read_size: MAX_IO,
        max_write_size: MAX_IO,
        server_start_time: 0,
        signing_required: server.config.signing_required,
        ciphers: vec![
            Cipher::Aes128Gcm,
            Cipher::Aes128Ccm,
            Cipher::Aes256Gcm,
            Cipher::Aes256Ccm,
        ],
        // HMAC-SHA256 last: a 3.1.1 client may still offer nothing else.
        signing: vec![
            SigningAlgorithm::AesGmac,
            SigningAlgorithm::AesCmac,
            SigningAlgorithm::HmacSha256,
        ],
        min_dialect: server.config.min_dialect,
        max_dialect: DIALECT_311,
    }
}

impl Conn {
    pub fn negotiate(
        &mut self,
        inc: &Incoming<'_>,
        req: &NegotiateRequest<'_>,
        out: &mut Vec<u8>,
    ) -> Outcome {
        if self.negotiated.is_some() {
            return Outcome::Disconnect("second NEGOTIATE");
        }
        let cfg = negotiate_config(&self.server);
        let salt: [u8; 32] = rand::random();
        let hint = smb_proto::auth::spnego::negotiate_hint();
        match negotiate(req, &cfg, &salt, crate::wire::now_filetime(), &hint) {
            Ok((n, resp)) => {
                self.preauth.update(inc.bytes);
                resp.encode(out);
                self.stats
                    .dialect
                    .store(n.dialect, std::sync::atomic::Ordering::Relaxed);
                self.negotiated = Some(n);
                Outcome::Reply(Reply::ok())
            }
            Err(s) => Outcome::Error(s),
        }
    }

    pub fn session_setup(
        &mut self,
        inc: &Incoming<'_>,
        req: &SessionSetupRequest<'_>,
        out: &mut Vec<u8>,
    ) -> Outcome {
        let Some(neg) = self.negotiated.clone() else {
            return Outcome::Disconnect("SESSION_SETUP before NEGOTIATE");
        };
        let mut sid = inc.header.session_id;
        if req.flags & SESSION_FLAG_BINDING != 0 && !self.pending_auth.contains_key(&sid) {
            Counters::bump(&self.server.counters.bind_attempts);
            if let Err(s) = self.start_binding(inc, &neg) {
                Counters::bump(&self.server.counters.binds_denied);
                tracing::debug!(peer = %self.peer, "SMB channel binding to session {sid:#x} refused: {s:?}");
                self.setup_session_id = Some(sid);
                return Outcome::Error(s);
            }
        } else if sid == 0 {
            if self.pending_auth.len() >= crate::state::MAX_PENDING_AUTH {
                return Outcome::Error(NtStatus::INSUFFICIENT_RESOURCES);
            }
            sid = self.server.new_id();
            self.pending_auth.insert(
                sid,
                PendingAuth {
                    auth: SessionAuth::new(self.challenge_params()),
                    preauth: self.preauth,
                    binding: None,
                },
            );
        } else if !self.pending_auth.contains_key(&sid) {
            // Re-authentication of a session this connection is a channel of: a new exchange
            // whose user must be the session's; the keys stay.
            self.setup_session_id = Some(sid);
            if !self.channels.contains_key(&sid) {
                return Outcome::Error(NtStatus::USER_SESSION_DELETED);
            }
            // Signed with this channel's key like any request on it (MS-SMB2 3.3.5.2.4).
            if let Err(s) = self.check_session(inc) {
                return Outcome::Error(s);
            }
            self.pending_auth.insert(
                sid,
                PendingAuth {
                    auth: SessionAuth::new(self.challenge_params()),
                    preauth: self.preauth,
                    binding: None,
                },
            );
        }
        self.setup_session_id = Some(sid);
        let Some(pending) = self.pending_auth.get_mut(&sid) else {
            return Outcome::Error(NtStatus::USER_SESSION_DELETED);
        };
        pending.preauth.update(inc.bytes);
        let users = self.server.users();
        let mut tried = None;
        let step = pending.auth.step(req.security_buffer, |user, _domain| {
            tried = Some(user.to_string());
            users.get(user)
        });
        match step {
            Ok(AuthStep::Continue(token)) => {
                SessionSetupResponse {
                    session_flags: 0,
                    security_buffer: &token,
                }
                .encode(out);
                Outcome::Reply(Reply::status(NtStatus::MORE_PROCESSING_REQUIRED))
            }
            Ok(AuthStep::Done { session, token }) => {
                let Some(pending) = self.pending_auth.remove(&sid) else {
                    return Outcome::Error(NtStatus::USER_SESSION_DELETED);
                };
                let session_key = session.session_key();
                if let Some(bound) = pending.binding {
                    if !bound.user.eq_ignore_ascii_case(&session.user) {
                        tracing::warn!(peer = %self.peer, user = %session.user, "SMB channel binding by another user refused");
                        Counters::bump(&self.server.counters.binds_denied);
                        return Outcome::Error(NtStatus::ACCESS_DENIED);
                    }
                    {
                        let mut st = bound.state.lock();
                        if st.channels >= MAX_CHANNELS {
                            Counters::bump(&self.server.counters.binds_denied);
                            return Outcome::Error(NtStatus::INSUFFICIENT_RESOURCES);
                        }
                        st.channels += 1;
                        st.channel_tx.push(self.tx.clone());
                        st.channel_stats.push(self.stats.clone());
                    }
                    Counters::bump(&self.server.counters.binds);
                    Counters::bump(&bound.binds);
                    let key = SessionKeys::channel_signing_key_for(
                        neg.dialect,
                        &session_key,
                        &pending.preauth,
                    );
                    self.channels.insert(
                        sid,
                        Channel {
                            signing: SigningKey::new(neg.signing, key),
                            session: bound,
                        },
                    );
                    tracing::info!(peer = %self.peer, user = %session.user, "SMB channel bound to session {sid:#x}");
                } else if let Some(live) = self.channels.get(&sid).map(|c| c.session.clone()) {
                    if !live.user.eq_ignore_ascii_case(&session.user) {
                        tracing::warn!(peer = %self.peer, user = %session.user, "SMB re-authentication as another user refused");
                        return Outcome::Error(NtStatus::ACCESS_DENIED);
                    }
                    tracing::debug!(peer = %self.peer, user = %session.user, "SMB session {sid:#x} re-authenticated");
                } else {
                    // A new session naming a previous one of the same user replaces it
                    // (MS-SMB2 3.3.5.5.3): the old one's opens close.
                    if req.previous_session_id != 0 && req.previous_session_id != sid {
                        if let Some(old) = self.server.session(req.previous_session_id) {
                            if old.user.eq_ignore_ascii_case(&session.user) {
                                end_session(&self.server, &old, true);
                                self.server.remove_session(old.id);
                            }
                        }
                    }
                    let keys = SessionKeys::derive(
                        neg.dialect,
                        &session_key,
                        &pending.preauth,
                        neg.cipher,
                    );
                    let signing_required = self.server.config.signing_required
                        || u16::from(req.security_mode) & SECURITY_SIGNING_REQUIRED != 0;
                    let s = Arc::new(Session {
                        id: sid,
                        user: session.user.clone(),
                        dialect: neg.dialect,
                        client_guid: neg.client_guid,
                        signing: neg.signing,
                        cipher: neg.cipher,
                        signing_required,
                        keys,
                        session_key,
                        state: parking_lot::Mutex::new(SessionState {
                            channels: 1,
                            channel_tx: vec![self.tx.clone()],
                            channel_stats: vec![self.stats.clone()],
                            next_tree: 1,
                            ..SessionState::default()
                        }),
                        closed: std::sync::atomic::AtomicBool::new(false),
                        binds: Default::default(),
                        channels_lost: Default::default(),
                    });
                    self.server.add_session(s.clone());
                    Counters::bump(&self.server.counters.sessions);
                    self.channels.insert(
                        sid,
                        Channel {
                            signing: SigningKey::new(s.signing, s.keys.signing),
                            session: s,
                        },
                    );
                    tracing::info!(peer = %self.peer, user = %session.user,
                        dialect = crate::stats::dialect_name(neg.dialect),
                        signing = crate::stats::signing_name(neg.signing),
                        cipher = crate::stats::cipher_name(neg.cipher),
                        "SMB session {sid:#x} established");
                }
                SessionSetupResponse {
                    session_flags: 0,
                    security_buffer: &token,
                }
                .encode(out);
                Outcome::Reply(Reply::ok())
            }
            Err(e) => {
                let binding = self
                    .pending_auth
                    .remove(&sid)
                    .is_some_and(|p| p.binding.is_some());
                if binding {
                    Counters::bump(&self.server.counters.binds_denied);
                } else if let Some(live) = self.channels.get(&sid).map(|c| c.session.clone()) {
                    // A failed re-authentication ends the session (MS-SMB2 3.3.5.5.3, as
                    // Windows does). Its channels stay until their connections go, so that
                    // USER_SESSION_DELETED goes back signed with their keys.
                    tracing::warn!(peer = %self.peer, user = %live.user, "SMB session {sid:#x} ended by a failed re-authentication");
                    end_session(&self.server, &live, false);
                    self.server.remove_session(sid);
                }
                let user = tried.unwrap_or_default();
                tracing::warn!(peer = %self.peer, user = %user, "SMB logon failure: {e}");
                Counters::bump(&self.server.counters.logon_failures);
                Outcome::Error(auth_status(&e))
            }
        }
    }

    /// The checks of MS-SMB2 3.3.5.5.2 before a binding exchange starts.
    fn start_binding(
        &mut self,
        inc: &Incoming<'_>,
        neg: &smb_proto::server::Negotiated,
    ) -> Result<(), NtStatus> {
        let sid = inc.header.session_id;
        if let Some(ch) = self.channels.get(&sid) {
            // A channel of the session already: the request is checked with its key first,
            // as any request on it (MS-SMB2 3.3.5.2.4).
            return Err(if ch.signing.verify(inc.bytes) {
                NtStatus::REQUEST_NOT_ACCEPTED
            } else {
                NtStatus::ACCESS_DENIED
            });
        }
        let session = self
            .server
            .session(sid)
            .ok_or(NtStatus::USER_SESSION_DELETED)?;
        if session.closed.load(Ordering::Relaxed) {
            return Err(NtStatus::USER_SESSION_DELETED);
        }
        // Signing algorithm, dialect and cipher against the session's
        // (`smb_proto::server::binding`, in Windows' order and with its statuses).
        binding::check(
            &binding::BoundSession {
                dialect: session.dialect,
                signing: session.signing,
                cipher: session.cipher,
            },
            &binding::BindingChannel {
                dialect: neg.dialect,
                signing: neg.signing,
                cipher: neg.cipher,
                signed: inc.header.flags.is_signed(),
            },
        )?;
        // MS-SMB2 3.3.5.5.2 lets a server refuse a channel whose ClientGuid differs from the
        // session's (a MAY); Windows binds it, and so does this server: the binding is still
        // signed with the session's key and authenticated as the session's user.
        if session.state.lock().channels >= MAX_CHANNELS {
            return Err(NtStatus::INSUFFICIENT_RESOURCES);
        }
        let key = SigningKey::new(session.signing, session.keys.signing);
        if !key.verify(inc.bytes) {
            return Err(NtStatus::ACCESS_DENIED);
        }
        self.pending_auth.insert(
            sid,
            PendingAuth {
                auth: SessionAuth::new(self.challenge_params()),
                preauth: self.preauth,
                binding: Some(session),
            },
        );
        Ok(())
    }

    fn challenge_params(&self) -> ChallengeParams {
        let name = self.server.config.server_name.clone();
        ChallengeParams {
            server_challenge: rand::random(),
            timestamp: crate::wire::now_filetime(),
            nb_domain: name.clone(),
            nb_computer: name.clone(),
            dns_domain: String::new(),
            dns_computer: name.to_lowercase(),
            version: [10, 0, 0x61, 0x4a, 0, 0, 0, 15],
        }
    }

    pub fn logoff(&mut self, session_id: u64, out: &mut Vec<u8>) -> Outcome {
        let Some(ch) = self.channels.get(&session_id) else {
            return Outcome::Error(NtStatus::USER_SESSION_DELETED);
        };
        let session = ch.session.clone();
        end_session(&self.server, &session, false);
        self.server.remove_session(session_id);
        LogoffResponse.encode(out);
        // The response is still signed with this channel's key; the channel goes after it.
        self.logged_off.push(session_id);
        Outcome::Reply(Reply::ok())
    }
}

/// The status of a failed authentication step: a token that does not parse (a truncated
/// NTLMv2 response, say) is INVALID_PARAMETER, as on Windows; the rest LOGON_FAILURE.
fn auth_status(e: &smb_proto::auth::AuthError) -> NtStatus {
    match e {
        smb_proto::auth::AuthError::Malformed(_) => NtStatus::INVALID_PARAMETER,
        _ => NtStatus::LOGON_FAILURE,
    }
}

/// Closes every open of a session and forgets its trees. With `keep_durable` (the session is
/// lost with its connection, or replaced by a new one), durable opens stay for a reconnect.
pub fn end_session(server: &Arc<Server>, session: &Session, keep_durable: bool) {
    session.closed.store(true, Ordering::Relaxed);
    let opens: Vec<_> = {
        let mut st = session.state.lock();
        st.trees.clear();
        st.opens.drain().map(|(_, o)| o).collect()
    };
    if keep_durable {
        crate::fs::durable::orphan_or_close(server, &session.user, session.client_guid, opens);
        return;
    }
    for o in opens {
        crate::fs::open::close_open(server, &o);
    }
}
