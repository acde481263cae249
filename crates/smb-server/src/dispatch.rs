//! From a decoded request to its handler: the session, signature and tree checks of
//! MS-SMB2 3.3.5.2.9-11 first.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use smb_proto::msg::{EchoResponse, Message as _, Request};
use smb_proto::NtStatus;

use crate::conn::{Conn, Incoming, Outcome, Reply};
use crate::state::{Session, Tree};

/// The session and tree a file-level request runs in.
pub struct Ctx<'a> {
    pub server: &'a crate::state::Server,
    pub session: &'a Arc<Session>,
    pub tree: &'a Arc<Tree>,
    /// The writer of the connection the request came on.
    pub tx: &'a tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    /// The request's ChannelSequence (a new open starts with it, MS-SMB2 3.3.5.9).
    pub channel_sequence: u16,
}

impl Conn {
    pub async fn dispatch(
        &mut self,
        inc: Incoming<'_>,
        mut req: Request<'_>,
        out: &mut Vec<u8>,
    ) -> Outcome {
        // Below 3.0 there is no ChannelSequence or replay flag, no DH2Q/DH2C, AppInstanceId or
        // lease v2, and 2.0.2 has no leases at all: they are taken out here so that the
        // handlers need not know the dialect.
        let dialect = self.negotiated.as_ref().map_or(0, |n| n.dialect);
        let plain;
        let inc = if smb_proto::server::dialect::is_smb3(dialect) {
            inc
        } else {
            plain = without_smb3_fields(inc.header);
            Incoming {
                header: &plain,
                ..inc
            }
        };
        if let Request::Create(r) = &mut req {
            contexts_for_dialect(&mut r.contexts, dialect);
        }
        match &req {
            Request::Negotiate(r) => return self.negotiate(&inc, r, out),
            Request::SessionSetup(r) => return self.session_setup(&inc, r, out),
            Request::Echo(_) => {
                EchoResponse.encode(out);
                return Outcome::Reply(Reply::ok());
            }
            _ => {}
        }
        let session = match self.check_session(&inc) {
            Ok(s) => s,
            Err(s) => return Outcome::Error(s),
        };
        if let Request::Logoff(_) = req {
            return self.logoff(inc.session_id, out);
        }
        if let Request::TreeConnect(r) = &req {
            return crate::tree::tree_connect(&self.server, &session, r, out).into();
        }
        let Some(tree_id) = inc.tree_id else {
            return Outcome::Error(NtStatus::NETWORK_NAME_DELETED);
        };
        let Some(tree) = session.tree(tree_id) else {
            return Outcome::Error(NtStatus::NETWORK_NAME_DELETED);
        };
        if let Request::TreeDisconnect(_) = req {
            return crate::tree::tree_disconnect(&self.server, &session, tree_id, out).into();
        }
        // A share a reload removed or changed: the client connects the tree again.
        if tree.share.as_ref().is_some_and(|s| s.is_retired()) {
            return Outcome::Error(NtStatus::NETWORK_NAME_DELETED);
        }
        let ctx = Ctx {
            server: &self.server,
            session: &session,
            tree: &tree,
            tx: &self.tx,
            channel_sequence: inc.header.channel_sequence(),
        };
        if let Request::Create(r) = &req {
            use crate::fs::durable;
            // Create context names are at least 4 bytes (Windows refuses shorter ones).
            if r.contexts.iter().any(|c| c.name.len() < 4) {
                return Outcome::Error(NtStatus::INVALID_PARAMETER);
            }
            let ask = match durable::DurableAsk::parse(r) {
                Ok(a) => a,
                Err(s) => return Outcome::Error(s),
            };
            if ask.is_reconnect() {
                if let Some((fid, _)) = ask.reconnect_target() {
                    durable::await_orphan(&self.server, &session, fid.persistent).await;
                }
                return durable::reconnect(&ctx, r, &ask, out).into();
            }
            let replay = inc.header.flags.is_replay();
            if let Some(result) = crate::fs::replay::replayed_create(&ctx, r, &ask, replay, out) {
                return result.into();
            }
            durable::close_app_instance(&self.server, &ask);
            if let Some((key, requester)) = crate::fs::open::requester(&ctx, r) {
                use crate::fs::oplock::{start_breaks, wait_for_breaks, waits_on, Step};
                durable::purge_conflicting(&self.server, key, &requester);
                if let Step::Wait { .. } = start_breaks(&self.server, key, &requester) {
                    if inc.last {
                        // MS-SMB2 3.3.4.2: an interim response now, the CREATE completes
                        // once the breaks are acknowledged; the connection keeps serving.
                        if let Some(guid) = ask.create_guid() {
                            durable::set_pending(&self.server, session.client_guid, guid, true);
                        }
                        return self.create_async(&inc, &session, &tree, key, requester);
                    }
                    // Inside a compound chain: waited for here, except on a holder of this
                    // very connection (its acknowledgment could not be read meanwhile).
                    if !waits_on(&self.server, key, &requester, &self.tx) {
                        wait_for_breaks(&self.server, key, &requester, None).await;
                    }
                }
            }
            let result = crate::fs::open::create(&ctx, r, out);
            if let Err(st) = &result {
                tracing::debug!(peer = %self.peer, "CREATE {:?} disposition {} options {:#x} access {:#x}: {:#x}",
                    r.name_string().unwrap_or_default(), r.create_disposition, r.create_options, r.desired_access, st.0);
            }
            return result.into();
        }
        if let Request::OplockBreak(smb_proto::msg::OplockBreak::LeaseAck {
            lease_key,
            lease_state,
            ..
        }) = &req
        {
            return crate::fs::oplock::acknowledge_lease(
                &self.server,
                session.client_guid,
                *lease_key,
                *lease_state,
                out,
            )
            .into();
        }
        let fid = match inc.file_id {
            Some(Some(f)) => f,
            Some(None) => return Outcome::Error(NtStatus::INVALID_PARAMETER),
            None => return Outcome::Error(NtStatus::INVALID_PARAMETER),
        };
        let replay = inc.header.flags.is_replay();
        let sequence = inc.header.channel_sequence();
        if let Request::Ioctl(r) = &req {
            let open = session.open(fid, tree_id);
            let _in_flight = match open
                .as_ref()
                .map(|o| crate::fs::replay::begin(o, sequence, replay, true))
            {
                Some(Err(s)) => return Outcome::Error(s),
                Some(Ok(f)) => f,
                None => None,
            };
            return crate::ioctl::ioctl(self, &ctx, r, fid, out);
        }
        let Some(open) = session.open(fid, tree_id) else {
            return Outcome::Error(NtStatus::FILE_CLOSED);
        };
        // Every request on the open follows its ChannelSequence; only WRITE and SET_INFO (and
        // IOCTL, above) are refused for a stale one.
        let modifies = matches!(req, Request::Write(_) | Request::SetInfo(_));
        let _in_flight = match crate::fs::replay::begin(&open, sequence, replay, modifies) {
            Ok(f) => f,
            Err(s) => return Outcome::Error(s),
        };
        if let Request::SetInfo(r) = &req {
            use crate::fs::oplock::{renames_or_deletes, start_handle_breaks, Step};
            // A rename or delete waits for the handle-caching breaks it starts (MS-FSA
            // 2.1.5.14): async, so the acknowledgments can come on this connection too.
            if inc.last
                && !tree.read_only
                && renames_or_deletes(r)
                && matches!(
                    start_handle_breaks(&self.server, open.key, open.volatile),
                    Step::Wait { .. }
                )
            {
                return self.setinfo_async(&inc, &session, &tree, open);
            }
        }
        let reply = match req {
            Request::Close(r) => crate::fs::open::close(&ctx, &open, &r, out),
            Request::Read(r) => crate::fs::io::read(&ctx, &open, &r, out).await,
            Request::Write(r) => crate::fs::io::write(&ctx, &open, &r, out).await,
            Request::Flush(_) => crate::fs::io::flush(&ctx, &open, out).await,
            Request::QueryInfo(r) => crate::fs::info::query_info(&ctx, &open, &r, out),
            Request::SetInfo(r) => crate::fs::setinfo::set_info(&ctx, &open, &r, out),
            Request::QueryDirectory(r) => crate::fs::dir::query_directory(&ctx, &open, &r, out),
            Request::Lock(r) => match crate::fs::lock::lock(&ctx, &open, &r, out) {
                Err(crate::fs::status::LOCK_NOT_GRANTED)
                    if inc.last && crate::fs::lock::may_block(&r) =>
                {
                    // MS-SMB2 3.3.5.14.2: a blocking lock waits; an interim response now.
                    return self.lock_async(&inc, &session, open, &r);
                }
                other => other,
            },
            Request::ChangeNotify(notify) => {
                if !open.is_dir {
                    return Outcome::Error(NtStatus::INVALID_PARAMETER);
                }
                let async_id = self.new_async_id();
                let op = crate::conn::AsyncOp {
                    async_id,
                    header: inc.header.clone(),
                    session_id: inc.session_id,
                    file_id: Some(fid),
                    done: Arc::new(std::sync::atomic::AtomicBool::new(false)),
                    encrypted: inc.encrypted,
                    on_close: NtStatus(0x0000_010B),
                    wake: None,
                };
                let frame =
                    self.async_frame(&op, crate::fs::status::NOTIFY_ENUM_DIR, inc.encrypted);
                let tree = notify.flags & smb_proto::msg::info::WATCH_TREE != 0;
                self.server.watch(crate::state::Watch {
                    dir: open.path.lock().clone(),
                    tree,
                    done: op.done.clone(),
                    frame,
                    tx: self.tx.clone(),
                });
                self.async_ops.push(op);
                return Outcome::Pending(async_id);
            }
            Request::OplockBreak(smb_proto::msg::OplockBreak::Oplock { oplock_level, .. }) => {
                crate::fs::oplock::acknowledge(&self.server, &open, oplock_level, out)
            }
            Request::OplockBreak(_) => Err(NtStatus::INVALID_PARAMETER),
            _ => Err(NtStatus::NOT_SUPPORTED),
        };
        if matches!(inc.header.command, smb_proto::Command::Close) && reply.is_ok() {
            // Pending CHANGE_NOTIFYs on the closed handle end with NOTIFY_CLEANUP, blocking
            // LOCKs with RANGE_NOT_LOCKED.
            let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.async_ops)
                .into_iter()
                .partition(|op| op.file_id == Some(fid) && op.session_id == inc.session_id);
            self.async_ops = keep;
            for op in done {
                let status = op.on_close;
                self.complete_async(op, status);
            }
        }
        reply.into()
    }

    /// The session a request names, with its signature checked.
    pub(crate) fn check_session(&self, inc: &Incoming<'_>) -> Result<Arc<Session>, NtStatus> {
        let Some(ch) = self.channels.get(&inc.session_id) else {
            // A session of the server that this connection is no channel of: a signed
            // request is still checked with the session's key (ACCESS_DENIED when it does not
            // verify), and USER_SESSION_DELETED goes back signed with that key.
            if inc.header.flags.is_signed() {
                if let Some(s) = self.server.session(inc.session_id) {
                    let key = smb_proto::crypto::SigningKey::new(s.signing, s.keys.signing);
                    if !key.verify(inc.bytes) {
                        return Err(NtStatus::ACCESS_DENIED);
                    }
                }
            }
            return Err(NtStatus::USER_SESSION_DELETED);
        };
        if ch.session.closed.load(Ordering::Relaxed) {
            return Err(NtStatus::USER_SESSION_DELETED);
        }
        if inc.header.flags.is_signed() {
            if !ch.signing.verify(inc.bytes) {
                tracing::warn!(peer = %self.peer, "SMB request with a bad signature");
                return Err(NtStatus::ACCESS_DENIED);
            }
        } else if ch.session.signing_required && !inc.encrypted {
            return Err(NtStatus::ACCESS_DENIED);
        }
        Ok(ch.session.clone())
    }
}

/// A request header of a 2.x connection as the handlers read it: Status is reserved there, so
/// ChannelSequence is 0, and SMB2_FLAGS_REPLAY_OPERATION means nothing.
fn without_smb3_fields(h: &smb_proto::Header) -> smb_proto::Header {
    let mut plain = h.clone();
    plain.status = 0;
    plain.flags.0 &= !smb_proto::header::Flags::REPLAY_OPERATION;
    plain
}

/// The create contexts a dialect has (MS-SMB2 3.3.5.9): from 3.0 all of them; 2.1 has no
/// DH2Q, DH2C or AppInstanceId, and reads a lease request as v1 (its first 32 bytes); 2.0.2
/// has no lease request either. The others are ignored, as the specification says.
fn contexts_for_dialect(contexts: &mut Vec<smb_proto::msg::CreateContext<'_>>, dialect: u16) {
    use smb_proto::msg::create::{
        CTX_APP_INSTANCE_ID, CTX_DURABLE_HANDLE_RECONNECT_V2, CTX_DURABLE_HANDLE_REQUEST_V2,
        CTX_REQUEST_LEASE,
    };
    if smb_proto::server::dialect::is_smb3(dialect) {
        return;
    }
    contexts.retain(|c| {
        c.name != CTX_DURABLE_HANDLE_REQUEST_V2
            && c.name != CTX_DURABLE_HANDLE_RECONNECT_V2
            && c.name != CTX_APP_INSTANCE_ID
            && !(c.name == CTX_REQUEST_LEASE && dialect < smb_proto::msg::negotiate::DIALECT_210)
    });
    for c in contexts.iter_mut() {
        if c.name == CTX_REQUEST_LEASE {
            if let Some(v1) = c.data.get(..32) {
                c.data = v1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smb_proto::msg::create::{
        CTX_DURABLE_HANDLE_REQUEST, CTX_DURABLE_HANDLE_REQUEST_V2, CTX_REQUEST_LEASE,
    };
    use smb_proto::msg::CreateContext;

    #[test]
    fn create_contexts_by_dialect() {
        let lease_v2 = [7u8; 52];
        let dh2q = [0u8; 32];
        let dhnq = [0u8; 16];
        let all = vec![
            CreateContext {
                name: CTX_REQUEST_LEASE,
                data: &lease_v2,
            },
            CreateContext {
                name: CTX_DURABLE_HANDLE_REQUEST_V2,
                data: &dh2q,
            },
            CreateContext {
                name: CTX_DURABLE_HANDLE_REQUEST,
                data: &dhnq,
            },
        ];
        for d in [0x0300, 0x0302, 0x0311] {
            let mut c = all.clone();
            contexts_for_dialect(&mut c, d);
            assert_eq!(c, all);
        }
        let mut c = all.clone();
        contexts_for_dialect(&mut c, 0x0210);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].name, c[0].data.len()), (CTX_REQUEST_LEASE, 32));
        assert_eq!(c[1].name, CTX_DURABLE_HANDLE_REQUEST);
        let mut c = all.clone();
        contexts_for_dialect(&mut c, 0x0202);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].name, CTX_DURABLE_HANDLE_REQUEST);
    }

    #[test]
    fn smb2_headers_lose_channel_sequence_and_replay() {
        let mut raw = [0u8; smb_proto::HEADER_LEN];
        raw[..4].copy_from_slice(&smb_proto::header::PROTOCOL_ID);
        raw[4] = 64;
        let mut h = smb_proto::Header::decode(&raw).unwrap();
        h.status = 0x0005;
        h.flags.0 |= smb_proto::header::Flags::REPLAY_OPERATION;
        let p = without_smb3_fields(&h);
        assert_eq!(p.channel_sequence(), 0);
        assert!(!p.flags.is_replay());
    }
}
