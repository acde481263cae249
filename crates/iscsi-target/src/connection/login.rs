//! The login phase of one connection: Login Requests until the login completes, fails or
//! times out (RFC 7143 6). What a completed login hands the full-feature phase is [`LoggedIn`].

use super::read_pdu;
use crate::limits::Limit;
use crate::login_phase::ConnectionPolicy;
use crate::server::{Portal, Server};
use crate::session::Session;
use bytes::BytesMut;
use iscsi_proto::login::{LoginOutcome, LoginStep, TargetLogin};
use iscsi_proto::pdu::*;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A completed login: its session, the negotiated outcome, the connection's CID and the next
/// StatSN.
pub(super) struct LoggedIn {
    pub session: Arc<Session>,
    pub outcome: Box<LoginOutcome>,
    pub cid: u16,
    pub stat_sn: u32,
}

/// Runs the login phase; `None` when the connection ends in it (refused, timed out, closed,
/// not a login, or its portal stopped while it waited for a Login Request), each case
/// answered and logged as RFC 7143 and the limits say. `at` is (portal, peer, local address).
/// The portal's stop ends the login only between requests: the session is created at the
/// last one, and what follows it is bounded by the login timeout and ends in the full-feature
/// phase's own cleanup.
pub(super) async fn log_in(
    server: &Arc<Server>,
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    buf: &mut BytesMut,
    at: (Portal, SocketAddr, SocketAddr),
    stop: &CancellationToken,
) -> Option<LoggedIn> {
    let (portal, peer, local) = at;
    let framer = Framer::default();
    let mut login = TargetLogin::new(server.login_defaults());
    let mut policy = ConnectionPolicy {
        server: server.clone(),
        portal,
        peer,
        cmd_sn: 0,
        session: None,
        reinstated: None,
        still_ending: Vec::new(),
        authorized_with: None,
    };
    let limits = &server.limits;
    let deadline = Instant::now() + limits.config.login_timeout;
    let mut login_text = crate::limits::LoginText::default();
    let (outcome, cid, stat_sn) = loop {
        let read = tokio::select! {
            r = tokio::time::timeout_at(deadline, read_pdu(rd, buf, &framer)) => r,
            _ = stop.cancelled() => return None,
        };
        let pdu = match read {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return None,
            Err(_) => {
                limits.login_timed_out(peer, local);
                return None;
            }
        };
        let Pdu::LoginRequest(req) = pdu else {
            // RFC 7143 6.1: only Login Requests are allowed before the login completes.
            limits.log.hit(peer.ip(), Limit::LoginRefused, || {
                format!("non-login PDU during login from {peer} on {local}; closing")
            });
            return None;
        };
        policy.cmd_sn = req.cmd_sn;
        let step = match login_text.check(&req, &limits.config) {
            Ok(()) => login.handle(&req, &mut policy),
            Err(step) => {
                limits.log.hit(peer.ip(), Limit::TextSize, || {
                    format!("login text over text-keys/text-bytes from {peer} on {local}")
                });
                step
            }
        };
        let (resp, done) = match step {
            LoginStep::Continue(resp) => (resp, None),
            LoginStep::Complete(resp, outcome) => (resp, Some(outcome)),
            LoginStep::Failed(resp, refusal) => {
                limits.log.hit(peer.ip(), Limit::LoginRefused, || {
                    let initiator = login_initiator(&req, &login);
                    format!("login refused: {refusal}; initiator {initiator}, peer {peer}, portal {local}")
                });
                let bytes = framer.encode_to_vec(&Pdu::LoginResponse(resp));
                let _ = tokio::time::timeout_at(deadline, wr.write_all(&bytes)).await;
                return None;
            }
        };
        if let Some(outcome) = done {
            // The old session's tasks end before the new one starts (RFC 7143 6.3.5), and so
            // do those of any earlier one whose reinstating login its initiator gave up.
            for earlier in std::mem::take(&mut policy.still_ending) {
                earlier.drain().await;
            }
            if let Some(old) = policy.reinstated.take() {
                old.drain().await;
                // `admit` has taken it out of the session table already, so `remove_session`
                // would not see it: its I_T nexus ends here (its SPC-2 reservation and unit
                // attentions go), or a peer reinstating in a loop would leave them behind.
                if let Some(t) = &old.target {
                    t.luns.nexus_lost(&old.nexus);
                }
            }
            let stat_sn = resp.stat_sn.wrapping_add(1);
            let bytes = framer.encode_to_vec(&Pdu::LoginResponse(resp));
            if !matches!(
                tokio::time::timeout_at(deadline, wr.write_all(&bytes)).await,
                Ok(Ok(()))
            ) {
                if let Some(s) = &policy.session {
                    if s.connection_count() == 0 {
                        server.remove_session(s);
                    }
                }
                return None;
            }
            break (outcome, req.cid, stat_sn);
        }
        let bytes = framer.encode_to_vec(&Pdu::LoginResponse(resp));
        match tokio::time::timeout_at(deadline, wr.write_all(&bytes)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return None,
            Err(_) => {
                limits.login_timed_out(peer, local);
                return None;
            }
        }
    };
    let session = policy.session.take()?;
    Some(LoggedIn {
        session,
        outcome,
        cid,
        stat_sn,
    })
}

fn login_initiator(req: &LoginRequest, login: &TargetLogin) -> String {
    match login.initiator_name() {
        "" => format!("(unnamed, isid {:02x?})", req.isid),
        name => name.to_owned(),
    }
}
