//! Async requests: CANCEL, the final answers of requests that went async (CHANGE_NOTIFY, a
//! CREATE waiting for lease or oplock break acknowledgments, a blocking LOCK), and the
//! encryption of whole frames.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use smb_proto::crypto::transform::{self, TRANSFORM_HEADER_LEN};
use smb_proto::crypto::SigningKey;
use smb_proto::msg::lock::LockElement;
use smb_proto::msg::{ErrorResponse, LockRequest, LockResponse, Message as _, Request};
use smb_proto::{Header, HeaderIds, NtStatus, HEADER_LEN};

use crate::conn::{set_prefix, AsyncOp, Conn, Incoming, Outcome};
use crate::dispatch::Ctx;
use crate::fs::open::Open;
use crate::fs::oplock::Requester;
use crate::state::{FileKey, Server, Session, Tree};

/// A request just registered as async (`Conn::register_async`): what its task needs to
/// answer it.
struct Pending {
    async_id: u64,
    /// Set by whoever answers first (the task, a CANCEL, the handle's close).
    done: Arc<AtomicBool>,
    /// Woken by a CANCEL or the handle's close, for tasks that wait on something else.
    wake: Arc<tokio::sync::Notify>,
    seal: Seal,
    header: Header,
    session_id: u64,
}

/// How the final response of an async request goes out: signed with its channel's key when
/// the request was signed or the session requires it, or encrypted for the session.
pub struct Seal {
    pub key: Option<SigningKey>,
    pub encrypt: Option<Arc<Session>>,
}

impl Seal {
    /// Fills in the async response header of `out` (prefix, header slot, body), then signs or
    /// encrypts it.
    pub fn finish(
        &self,
        request: &Header,
        async_id: u64,
        session_id: u64,
        status: NtStatus,
        mut out: Vec<u8>,
    ) -> Vec<u8> {
        let mut rh = Header::response_to(request, status, 0);
        rh.ids = HeaderIds::Async { async_id };
        rh.flags.0 &= !smb_proto::header::Flags::RELATED_OPERATIONS;
        rh.session_id = session_id;
        if let Some(slot) = out.get_mut(4..4 + HEADER_LEN) {
            slot.copy_from_slice(&rh.to_bytes());
        }
        if let Some(session) = &self.encrypt {
            if let Ok(f) = encrypt_frame(session, out.get(4..).unwrap_or(&[]).to_vec()) {
                return f;
            }
        }
        if let (Some(key), Some(msg)) = (&self.key, out.get_mut(4..)) {
            let _ = key.sign(msg);
        }
        set_prefix(&mut out);
        out
    }
}

impl Conn {
    /// CANCEL: answers the matching async request with STATUS_CANCELLED.
    pub fn cancel(&mut self, h: &Header) {
        let pos = self.async_ops.iter().position(|op| match h.ids {
            HeaderIds::Async { async_id } => op.async_id == async_id,
            HeaderIds::Sync { .. } => op.header.message_id == h.message_id,
        });
        if let Some(i) = pos {
            let op = self.async_ops.swap_remove(i);
            self.complete_async(op, NtStatus::CANCELLED);
        }
    }

    /// Sends the final response of an async request with an empty ERROR body.
    pub fn complete_async(&mut self, op: AsyncOp, status: NtStatus) {
        if op.done.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        if let Some(w) = &op.wake {
            w.notify_one();
        }
        let out = self.async_frame(&op, status, false);
        self.extra.push(out);
    }

    /// How the final answer of a request of `session_id` goes out.
    pub fn seal_for(&self, request: &Header, session_id: u64, encrypt: bool) -> Seal {
        let Some(ch) = self.channels.get(&session_id) else {
            return Seal {
                key: None,
                encrypt: None,
            };
        };
        Seal {
            key: (request.flags.is_signed() || ch.session.signing_required)
                .then(|| ch.signing.clone()),
            encrypt: encrypt.then(|| ch.session.clone()),
        }
    }

    /// The final answer of an async request: ERROR body, or for STATUS_NOTIFY_ENUM_DIR an
    /// empty CHANGE_NOTIFY response; signed as the request asks; encrypted when `seal`.
    pub fn async_frame(&self, op: &AsyncOp, status: NtStatus, seal: bool) -> Vec<u8> {
        let mut out = vec![0u8; 4 + HEADER_LEN];
        if status == crate::fs::status::NOTIFY_ENUM_DIR {
            smb_proto::msg::ChangeNotifyResponse { output: &[] }.encode(&mut out);
        } else {
            ErrorResponse::default().encode(&mut out);
        }
        self.seal_for(&op.header, op.session_id, seal).finish(
            &op.header,
            op.async_id,
            op.session_id,
            status,
            out,
        )
    }

    /// A CREATE whose file has lease or oplock breaks waiting for acknowledgments goes async
    /// (MS-SMB2 3.3.4.2, 3.3.5.9): the interim STATUS_PENDING is answered now and the
    /// connection keeps serving; a task waits for the breaks (35 s at most each), runs the
    /// CREATE and sends its final response, signed or encrypted as the request was. A CANCEL
    /// before that answers STATUS_CANCELLED and the CREATE is not run.
    pub fn create_async(
        &mut self,
        inc: &Incoming<'_>,
        session: &Arc<Session>,
        tree: &Arc<Tree>,
        key: FileKey,
        requester: Requester,
    ) -> Outcome {
        let Pending {
            async_id,
            done,
            seal,
            header,
            session_id,
            ..
        } = self.register_async(inc, None, NtStatus::CANCELLED);
        let bytes = inc.bytes.to_vec();
        let (server, session, tree, tx) = (
            self.server.clone(),
            session.clone(),
            tree.clone(),
            self.tx.clone(),
        );
        tokio::spawn(async move {
            crate::fs::oplock::wait_for_breaks(&server, key, &requester, Some(&done)).await;
            let Ok(Request::Create(req)) = Request::decode(&header, &bytes) else {
                return;
            };
            // The CreateGuid stops being pending once the CREATE has run or was cancelled.
            let guid = crate::fs::durable::DurableAsk::parse(&req)
                .ok()
                .and_then(|a| a.create_guid());
            let unpend = || {
                if let Some(g) = guid {
                    crate::fs::durable::set_pending(&server, session.client_guid, g, false);
                }
            };
            if done.swap(true, Ordering::AcqRel) {
                unpend();
                return;
            }
            let ctx = Ctx {
                server: &server,
                session: &session,
                tree: &tree,
                tx: &tx,
                channel_sequence: header.channel_sequence(),
            };
            let mut out = vec![0u8; 4 + HEADER_LEN];
            let status = match crate::fs::open::create(&ctx, &req, &mut out) {
                Ok(r) => r.status,
                Err(s) => {
                    out.truncate(4 + HEADER_LEN);
                    ErrorResponse::default().encode(&mut out);
                    s
                }
            };
            unpend();
            let _ = tx.send(seal.finish(&header, async_id, session_id, status, out));
        });
        Outcome::Pending(async_id)
    }
}

impl Conn {
    /// Records `inc` as an async request of this connection (CANCEL, and for `file_id` the
    /// handle's close answered with `on_close`, find it here).
    fn register_async(
        &mut self,
        inc: &Incoming<'_>,
        file_id: Option<smb_proto::msg::FileId>,
        on_close: NtStatus,
    ) -> Pending {
        let async_id = self.new_async_id();
        let done = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(tokio::sync::Notify::new());
        self.async_ops.retain(|op| !op.done.load(Ordering::Acquire));
        self.async_ops.push(AsyncOp {
            async_id,
            header: inc.header.clone(),
            session_id: inc.session_id,
            file_id,
            done: done.clone(),
            encrypted: inc.encrypted,
            on_close,
            wake: file_id.map(|_| wake.clone()),
        });
        Pending {
            async_id,
            done,
            wake,
            seal: self.seal_for(inc.header, inc.session_id, inc.encrypted),
            header: inc.header.clone(),
            session_id: inc.session_id,
        }
    }

    /// A blocking LOCK that cannot be granted now goes async (MS-SMB2 3.3.5.14.2): the interim
    /// STATUS_PENDING is answered, and a task retries the lock whenever a range of the file is
    /// released. It ends with SUCCESS once granted, CANCELLED on a CANCEL, RANGE_NOT_LOCKED
    /// when its handle is closed (CLOSE, TREE_DISCONNECT, LOGOFF) first.
    pub fn lock_async(
        &mut self,
        inc: &Incoming<'_>,
        session: &Arc<Session>,
        open: Arc<Open>,
        req: &LockRequest,
    ) -> Outcome {
        let Some(element) = req.locks.first().copied() else {
            return Outcome::Error(NtStatus::INVALID_PARAMETER);
        };
        let lock_sequence = req.lock_sequence;
        let Pending {
            async_id,
            done,
            wake,
            seal,
            header,
            session_id,
        } = self.register_async(
            inc,
            Some(open.file_id()),
            crate::fs::status::RANGE_NOT_LOCKED,
        );
        let (server, tx) = (self.server.clone(), self.tx.clone());
        tracing::debug!(session = %format_args!("{:#x}", session.id), "blocking LOCK {}+{} waits", element.offset, element.length);
        tokio::spawn(async move {
            let status = wait_for_lock(&server, &open, element, &done, &wake).await;
            let Some(status) = status else { return };
            if done.swap(true, Ordering::AcqRel) {
                // Answered meanwhile (a CANCEL): a lock just taken is given back.
                if status == NtStatus::SUCCESS {
                    undo_lock(&server, &open, element);
                }
                return;
            }
            let mut out = vec![0u8; 4 + HEADER_LEN];
            if status == NtStatus::SUCCESS {
                open.lock_sequences.done(lock_sequence);
                LockResponse.encode(&mut out);
            } else {
                ErrorResponse::default().encode(&mut out);
            }
            let _ = tx.send(seal.finish(&header, async_id, session_id, status, out));
        });
        Outcome::Pending(async_id)
    }
}

/// Retries `element` on `open` each time a range of its file is released; None once someone
/// else has answered the request (`done`, then `wake`).
async fn wait_for_lock(
    server: &Server,
    open: &Open,
    element: LockElement,
    done: &AtomicBool,
    wake: &tokio::sync::Notify,
) -> Option<NtStatus> {
    let released = server.locks.waiter(open.key);
    let status = loop {
        let notified = released.notified();
        tokio::pin!(notified);
        // Registered before the attempt, so a release between the two is not missed.
        notified.as_mut().enable();
        if done.load(Ordering::Acquire) {
            break None;
        }
        if open.closed.load(Ordering::Acquire) {
            break Some(crate::fs::status::RANGE_NOT_LOCKED);
        }
        match server
            .locks
            .apply(open.key, open.volatile, std::slice::from_ref(&element))
        {
            Ok(()) if open.closed.load(Ordering::Acquire) => {
                // Closed while the lock was being taken: its ranges are already released.
                server.locks.release_open(open.key, open.volatile);
                break Some(crate::fs::status::RANGE_NOT_LOCKED);
            }
            Ok(()) => {
                crate::fs::oplock::break_on_lock(server, open.key, open.volatile);
                break Some(NtStatus::SUCCESS);
            }
            Err(crate::fs::status::LOCK_NOT_GRANTED) => {}
            Err(s) => break Some(s),
        }
        tokio::select! {
            _ = notified => {}
            _ = wake.notified() => {}
        }
    };
    server.locks.unwait(open.key, released);
    status
}

fn undo_lock(server: &Server, open: &Open, element: LockElement) {
    let unlock = LockElement {
        flags: smb_proto::msg::lock::LOCKFLAG_UNLOCK,
        ..element
    };
    let _ = server
        .locks
        .apply(open.key, open.volatile, std::slice::from_ref(&unlock));
}

/// Encrypts a response chain for `session`: prefix, TRANSFORM_HEADER, ciphertext.
pub fn encrypt_frame(session: &Session, mut body: Vec<u8>) -> Result<Vec<u8>, &'static str> {
    let cipher = session.cipher.ok_or("no cipher")?;
    let nonce: [u8; 16] = rand::random();
    let n = nonce.get(..cipher.nonce_len()).ok_or("nonce")?;
    let th = transform::encrypt(
        cipher,
        session.keys.s2c_cipher.as_bytes(),
        n,
        session.id,
        &mut body,
    )
    .map_err(|_| "encryption")?;
    let mut out = Vec::with_capacity(4 + TRANSFORM_HEADER_LEN + body.len());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&th.encode());
    out.extend_from_slice(&body);
    set_prefix(&mut out);
    Ok(out)
}

impl Conn {
    /// A rename or delete (SET_INFO) whose file has handle-caching breaks outstanding goes
    /// async (MS-SMB2 3.3.4.2): the interim STATUS_PENDING is answered and the connection keeps
    /// serving (the acknowledgments among the rest); a task waits for the breaks (35 s at most
    /// each), runs the SET_INFO and sends its final response. CANCEL answers CANCELLED and
    /// closing the handle FILE_CLOSED; then the SET_INFO is not run.
    pub fn setinfo_async(
        &mut self,
        inc: &Incoming<'_>,
        session: &Arc<Session>,
        tree: &Arc<Tree>,
        open: Arc<Open>,
    ) -> Outcome {
        let Pending {
            async_id,
            done,
            wake,
            seal,
            header,
            session_id,
        } = self.register_async(inc, Some(open.file_id()), NtStatus::FILE_CLOSED);
        let bytes = inc.bytes.to_vec();
        let (server, session, tree, tx) = (
            self.server.clone(),
            session.clone(),
            tree.clone(),
            self.tx.clone(),
        );
        tokio::spawn(async move {
            let (key, actor) = (open.key, open.volatile);
            tokio::select! {
                _ = crate::fs::oplock::wait_until_acknowledged(&server, key, Some(&done), || {
                    crate::fs::oplock::start_handle_breaks(&server, key, actor)
                }) => {}
                _ = wake.notified() => {}
            }
            if done.swap(true, Ordering::AcqRel) {
                return;
            }
            let Ok(Request::SetInfo(req)) = Request::decode(&header, &bytes) else {
                return;
            };
            let ctx = Ctx {
                server: &server,
                session: &session,
                tree: &tree,
                tx: &tx,
                channel_sequence: header.channel_sequence(),
            };
            let mut out = vec![0u8; 4 + HEADER_LEN];
            let status = if open.closed.load(Ordering::Acquire) {
                ErrorResponse::default().encode(&mut out);
                NtStatus::FILE_CLOSED
            } else {
                match crate::fs::setinfo::set_info(&ctx, &open, &req, &mut out) {
                    Ok(r) => r.status,
                    Err(s) => {
                        out.truncate(4 + HEADER_LEN);
                        ErrorResponse::default().encode(&mut out);
                        s
                    }
                }
            };
            let _ = tx.send(seal.finish(&header, async_id, session_id, status, out));
        });
        Outcome::Pending(async_id)
    }
}
