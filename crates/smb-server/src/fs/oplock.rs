//! Exclusive and batch oplocks (MS-SMB2 3.3.1.4, 3.3.4.6, 3.3.5.22.1). One is granted only to
//! an open that is alone on its file; a later CREATE of that file from another open first
//! breaks it to none: the break notification goes to the connection the holder was opened on,
//! and the CREATE waits for the acknowledgment (or the holder's CLOSE) up to 35 seconds, after
//! which the oplock counts as broken. Level II oplocks and leases are not granted.

use std::sync::Arc;
use std::time::Duration;

use smb_proto::msg::{encode_message, FileId, Message as _, OplockBreak};
use smb_proto::{Command, Header, HeaderIds, NtStatus};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::Notify;

use super::open::Open;
use crate::conn::Reply;
use crate::state::{FileKey, Server};

pub const LEVEL_NONE: u8 = 0x00;
pub const LEVEL_EXCLUSIVE: u8 = 0x08;
pub const LEVEL_BATCH: u8 = 0x09;
/// How long a CREATE waits for a break acknowledgment (MS-SMB2 3.3.2.1: 35 s).
pub const BREAK_TIMEOUT: Duration = Duration::from_secs(35);
const INVALID_OPLOCK_PROTOCOL: NtStatus = NtStatus(0xC000_00E3);

/// The open holding a file's oplock.
#[derive(Debug)]
pub struct Holder {
    pub open: u64,
    pub level: u8,
    pub file_id: FileId,
    /// The writer of the connection the open was created on.
    pub tx: UnboundedSender<Vec<u8>>,
    pub breaking: bool,
    /// Woken when the oplock is gone (acknowledged, closed, timed out).
    pub gone: Arc<Notify>,
}

/// The level to grant: exclusive or batch when asked for and the open is alone on the file.
pub fn grant(requested: u8, alone: bool, is_dir: bool) -> u8 {
    if alone && !is_dir && matches!(requested, LEVEL_EXCLUSIVE | LEVEL_BATCH) {
        requested
    } else {
        LEVEL_NONE
    }
}

fn notification(file_id: FileId) -> Vec<u8> {
    let mut blank = [0u8; 64];
    blank[..4].copy_from_slice(&smb_proto::header::PROTOCOL_ID);
    blank[4] = 64;
    let mut out = vec![0u8; 4];
    if let Ok(mut h) = Header::decode(&blank) {
        h.command = Command::OplockBreak;
        h.flags.0 = smb_proto::header::Flags::SERVER_TO_REDIR;
        h.message_id = u64::MAX;
        h.ids = HeaderIds::Sync {
            process_id: 0,
            tree_id: 0,
        };
        out.extend_from_slice(&encode_message(
            &h,
            &OplockBreak::Oplock {
                oplock_level: LEVEL_NONE,
                file_id,
            },
        ));
    }
    let len = (out.len() - 4) as u32;
    if let Some(p) = out.get_mut(..4) {
        p.copy_from_slice(&len.to_be_bytes());
    }
    out
}

/// Breaks another open's oplock on `key` and waits until it is gone. `own_tx` is the
/// requester's writer: when the holder lives on the same connection the acknowledgment
/// cannot be read while this connection waits, so the break is sent and not waited for.
pub async fn break_and_wait(server: &Server, key: FileKey, own_tx: &UnboundedSender<Vec<u8>>) {
    for _ in 0..4 {
        let gone = {
            let mut files = server.files.lock();
            let Some(h) = files.get_mut(&key).and_then(|st| st.oplock.as_mut()) else {
                return;
            };
            if !h.breaking {
                h.breaking = true;
                if h.tx.send(notification(h.file_id)).is_err() {
                    // The holder's connection is gone: nothing can act on the break.
                    release_holder(server, key, None);
                    return;
                }
            }
            if h.tx.same_channel(own_tx) {
                return;
            }
            h.gone.clone()
        };
        let notified = gone.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Re-check after registering: the holder may have gone in between.
        if server
            .files
            .lock()
            .get(&key)
            .is_none_or(|st| st.oplock.is_none())
        {
            return;
        }
        if tokio::time::timeout(BREAK_TIMEOUT, notified).await.is_err() {
            tracing::warn!("SMB oplock break not acknowledged within {BREAK_TIMEOUT:?}");
            release_holder(server, key, None);
        }
    }
}

/// Drops the oplock of `key` (of open `only` when given) and wakes the waiters.
pub fn release_holder(server: &Server, key: FileKey, only: Option<u64>) {
    let mut files = server.files.lock();
    if let Some(st) = files.get_mut(&key) {
        if st
            .oplock
            .as_ref()
            .is_some_and(|h| only.is_none_or(|o| o == h.open))
        {
            if let Some(h) = st.oplock.take() {
                h.gone.notify_waiters();
            }
        }
    }
}

/// OPLOCK_BREAK acknowledgment from the client.
pub fn acknowledge(
    server: &Server,
    open: &Arc<Open>,
    level: u8,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    {
        let mut files = server.files.lock();
        let st = files.get_mut(&open.key).ok_or(INVALID_OPLOCK_PROTOCOL)?;
        let breaking = st
            .oplock
            .as_ref()
            .is_some_and(|h| h.open == open.volatile && h.breaking);
        if !breaking {
            return Err(INVALID_OPLOCK_PROTOCOL);
        }
        if level != LEVEL_NONE {
            // Broken to none: acknowledging a higher level is a protocol error; the oplock
            // is gone all the same.
            if let Some(h) = st.oplock.take() {
                h.gone.notify_waiters();
            }
            return Err(INVALID_OPLOCK_PROTOCOL);
        }
        if let Some(h) = st.oplock.take() {
            h.gone.notify_waiters();
        }
    }
    OplockBreak::Oplock {
        oplock_level: LEVEL_NONE,
        file_id: open.file_id(),
    }
    .encode(out);
    Ok(Reply::ok())
}
