//! The compound chain inside one frame (MS-SMB2 3.3.5.2.7): each element's credits, session,
//! tree and signature checks, the related-request substitutions, dispatch, and the response
//! chain signed per element.

use super::*;

impl Conn {
    pub(super) async fn handle_chain(
        &mut self,
        frame: &[u8],
        encrypted: Option<&Arc<Session>>,
        force_first: Option<NtStatus>,
    ) -> Result<Vec<u8>, &'static str> {
        let (elements, bad) = split_compound_partial(frame);
        if elements.is_empty() {
            return Err("frame is not an SMB2 message");
        }
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(&[0; 4]);
        let mut built: Vec<Built> = Vec::with_capacity(elements.len());
        let mut related = RelatedIds::default();
        let mut prev_status = NtStatus::SUCCESS;
        // A failed CREATE's status, which the related requests after it inherit; a chain
        // whose first element is marked related fails whole.
        let mut create_err = force_first;
        let mut interim_setup: Option<(u64, usize)> = None;
        for e in &elements {
            let h = &e.header;
            if h.flags.is_response() {
                return Err("a response from the client");
            }
            ConnStats::add(&self.stats.requests, 1);
            if h.command == Command::Cancel {
                self.cancel(h);
                continue;
            }
            let decoded = Request::decode(h, e.bytes);
            let payload = decoded.as_ref().map_or(0, Request::payload_size);
            let large_mtu = self
                .negotiated
                .as_ref()
                .is_some_and(|n| n.capabilities & smb_proto::msg::negotiate::CAP_LARGE_MTU != 0);
            let mut early = if e.offset == 0 { force_first } else { None };
            // 2.0.2 has no multi-credit requests: 64 KiB at most (its MaxRead/Write/Transact).
            let smb202 = self
                .negotiated
                .as_ref()
                .is_some_and(|n| n.dialect == smb_proto::msg::negotiate::DIALECT_202);
            if smb202 && payload > 65536 {
                early = Some(NtStatus::INVALID_PARAMETER);
            }
            if is_charged(h.command) {
                if let Err(ce) =
                    self.window
                        .consume(h.message_id, h.credit_charge, payload, large_mtu)
                {
                    match ce.answer() {
                        Answer::Disconnect => return Err("MessageId outside the credit window"),
                        Answer::Status(s) => early = Some(s),
                    }
                }
            }
            let (session_id, tree_id) = related.ids_for(h);
            if let Some(prev) = built.last() {
                crate::wire::pad8(&mut out, prev.start);
                let next = (out.len() - prev.start) as u32;
                crate::wire::patch_u32(&mut out, prev.start + NEXT_COMMAND_OFFSET, next);
            }
            let start = out.len();
            out.resize(start + HEADER_LEN, 0);
            // A request that cannot be decoded (an unknown command among them) gets its own
            // answer even after a failed request it is related to.
            let undecodable = decoded.is_err() && self.negotiated.is_some();
            if !h.flags.is_related() && e.offset != 0 {
                create_err = None;
            }
            // The FileId this request names (after the related substitution), if any.
            let mut used_fid = None;
            let outcome = if let Some(s) = early {
                Outcome::Error(s)
            } else if let Some(s) = inherited_error(h, undecodable, prev_status, create_err) {
                Outcome::Error(s)
            } else if self.negotiated.is_none() && h.command != Command::Negotiate {
                return Err("request before NEGOTIATE");
            } else {
                match decoded {
                    Err(de) => match log_undecodable(self.peer, h.command, &de) {
                        Answer::Disconnect => return Err("undecodable request"),
                        Answer::Status(s) => Outcome::Error(s),
                    },
                    Ok(req) => {
                        let fid = request_file_id(&req).map(|f| related.file_id_for(h, f));
                        used_fid = fid;
                        let ctx = Incoming {
                            header: h,
                            bytes: e.bytes,
                            session_id,
                            tree_id,
                            file_id: fid,
                            encrypted: encrypted.is_some(),
                            last: e.offset + e.bytes.len() >= frame.len(),
                        };
                        self.dispatch(ctx, req, &mut out).await
                    }
                }
            };
            let (status, file_id, async_id, new_tree) = match outcome {
                Outcome::Disconnect(why) => return Err(why),
                Outcome::Reply(r) => (r.status, r.file_id, None, r.tree_id),
                Outcome::Error(s) => {
                    out.truncate(start + HEADER_LEN);
                    ErrorResponse::default().encode(&mut out);
                    (s, None, None, None)
                }
                Outcome::Pending(id) => {
                    out.truncate(start + HEADER_LEN);
                    ErrorResponse::default().encode(&mut out);
                    (NtStatus::PENDING, None, Some(id), None)
                }
            };
            let tree_id = new_tree.or(tree_id);
            tracing::trace!(peer = %self.peer, "{:?} mid {} -> {:#x}", h.command, h.message_id, status.0);
            let grant = self.window.grant(h.credits.max(1));
            let mut rh = Header::response_to(h, status, grant);
            if let Some(id) = async_id {
                rh.ids = HeaderIds::Async { async_id: id };
            }
            // Related requests' all-ones ids are answered with the real ones; SESSION_SETUP
            // names the session it created.
            rh.session_id = self.setup_session_id.take().unwrap_or(session_id);
            if let (HeaderIds::Sync { process_id, .. }, Some(t)) = (rh.ids, tree_id) {
                rh.ids = HeaderIds::Sync {
                    process_id,
                    tree_id: t,
                };
            }
            if let Some(slot) = out.get_mut(start..start + HEADER_LEN) {
                slot.copy_from_slice(&rh.to_bytes());
            }
            let key = self.response_key(h, rh.session_id, status, encrypted.is_some());
            built.push(Built { start, key });
            // The next related request works on the FileId this one created or named, even
            // when this one failed (a WRITE refused on a good handle leaves it to the READ
            // after it; a CLOSE of a closed one leaves that closed one).
            let next_fid = match (h.command, used_fid) {
                (Command::Create, _) => file_id,
                (_, Some(named)) => named,
                (_, None) => file_id.or(related.file_id),
            };
            related = RelatedIds {
                session_id,
                tree_id: tree_id.unwrap_or(related.tree_id),
                file_id: next_fid,
            };
            prev_status = if status == NtStatus::PENDING {
                NtStatus::SUCCESS
            } else {
                status
            };
            if h.command == Command::Create {
                create_err = prev_status.is_error().then_some(prev_status);
            }
            if h.command == Command::SessionSetup && status == NtStatus::MORE_PROCESSING_REQUIRED {
                // Hashed once signed (an interim binding response is).
                interim_setup = Some((rh.session_id, built.len() - 1));
            }
            if h.command == Command::Negotiate && status == NtStatus::SUCCESS {
                self.preauth.update(out.get(start..).unwrap_or(&[]));
            }
        }
        if let Some(err) = bad {
            // The malformed element ends the chain; the well-formed ones were answered.
            tracing::debug!(peer = %self.peer, "malformed compound: {err}");
        }
        if built.is_empty() {
            // Only CANCELs: their answers (if any) are in `extra`.
            return Ok(Vec::new());
        }
        let ends: Vec<usize> = built
            .iter()
            .skip(1)
            .map(|b| b.start)
            .chain(std::iter::once(out.len()))
            .collect();
        for (b, end) in built.iter().zip(ends) {
            if let (Some(key), Some(msg)) = (&b.key, out.get_mut(b.start..end)) {
                key.sign(msg).map_err(|_| "signing")?;
            }
        }
        if let Some((sid, i)) = interim_setup {
            let start = built.get(i).map_or(0, |b| b.start);
            let end = built.get(i + 1).map_or(out.len(), |b| b.start);
            if let (Some(p), Some(msg)) = (self.pending_auth.get_mut(&sid), out.get(start..end)) {
                p.preauth.update(msg);
            }
        }
        for id in std::mem::take(&mut self.logged_off) {
            self.channels.remove(&id);
        }
        set_prefix(&mut out);
        Ok(out)
    }
}

/// A request on its way to a handler, with the related-compound substitution applied.
pub struct Incoming<'a> {
    pub header: &'a Header,
    /// The whole message, header first.
    pub bytes: &'a [u8],
    pub session_id: u64,
    pub tree_id: Option<u32>,
    /// The FileId the request names; Some(None) when it asks for a previous one that is absent.
    pub file_id: Option<Option<FileId>>,
    pub encrypted: bool,
    /// The last element of its compound chain (only that one may go async here).
    pub last: bool,
}

/// The error a related request inherits (MS-SMB2 3.3.5.2.7.2, as Windows and Samba apply it):
/// after an element that named no session, INVALID_PARAMETER (its session is the previous
/// one's); after a failed CREATE, that CREATE's status (its FileId is the CREATE's). A related
/// request after another failed one runs on its own, on the FileId that one named. A request
/// that cannot be decoded answers for itself.
fn inherited_error(
    h: &Header,
    undecodable: bool,
    prev_status: NtStatus,
    create_err: Option<NtStatus>,
) -> Option<NtStatus> {
    if !h.flags.is_related() || undecodable {
        return None;
    }
    if prev_status == NtStatus::USER_SESSION_DELETED {
        return Some(NtStatus::INVALID_PARAMETER);
    }
    create_err
}

fn log_undecodable(peer: SocketAddr, command: Command, e: &smb_proto::DecodeError) -> Answer {
    tracing::debug!(peer = %peer, "undecodable {command:?}: {e}");
    e.answer()
}

fn request_file_id(req: &Request<'_>) -> Option<FileId> {
    Some(match req {
        Request::Close(r) => r.file_id,
        Request::Flush(r) => r.file_id,
        Request::Read(r) => r.file_id,
        Request::Write(r) => r.file_id,
        Request::Lock(r) => r.file_id,
        Request::Ioctl(r) => r.file_id,
        Request::QueryDirectory(r) => r.file_id,
        Request::ChangeNotify(r) => r.file_id,
        Request::QueryInfo(r) => r.file_id,
        Request::SetInfo(r) => r.file_id,
        Request::OplockBreak(smb_proto::msg::OplockBreak::Oplock { file_id, .. }) => *file_id,
        _ => return None,
    })
}
