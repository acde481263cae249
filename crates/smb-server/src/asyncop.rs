//! Async requests: CANCEL, the final answers of requests that went async, and the encryption
//! of whole frames.

use smb_proto::crypto::transform::{self, TRANSFORM_HEADER_LEN};
use smb_proto::msg::{ErrorResponse, Message as _};
use smb_proto::{Header, HeaderIds, NtStatus};

use crate::conn::{set_prefix, AsyncOp, Conn};
use crate::state::Session;

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
        let out = self.async_frame(&op, status, false);
        self.extra.push(out);
    }

    /// The final answer of an async request: ERROR body, or for STATUS_NOTIFY_ENUM_DIR an
    /// empty CHANGE_NOTIFY response; signed as the request asks; encrypted when `seal`.
    pub fn async_frame(&self, op: &AsyncOp, status: NtStatus, seal: bool) -> Vec<u8> {
        let mut rh = Header::response_to(&op.header, status, 0);
        rh.ids = HeaderIds::Async {
            async_id: op.async_id,
        };
        rh.flags.0 &= !smb_proto::header::Flags::RELATED_OPERATIONS;
        rh.session_id = op.session_id;
        let mut out = vec![0u8; 4];
        rh.encode(&mut out);
        if status == crate::fs::status::NOTIFY_ENUM_DIR {
            smb_proto::msg::ChangeNotifyResponse { output: &[] }.encode(&mut out);
        } else {
            ErrorResponse::default().encode(&mut out);
        }
        if let Some(ch) = self.channels.get(&op.session_id) {
            if seal {
                if let Ok(f) = encrypt_frame(&ch.session, out.get(4..).unwrap_or(&[]).to_vec()) {
                    return f;
                }
            }
            if op.header.flags.is_signed() || ch.session.signing_required {
                if let Some(msg) = out.get_mut(4..) {
                    let _ = ch.signing.sign(msg);
                }
            }
        }
        set_prefix(&mut out);
        out
    }
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
