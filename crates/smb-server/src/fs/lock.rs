//! Byte-range locks (MS-SMB2 3.3.5.14): shared and exclusive ranges per file, owned by an open.
//! A lock that cannot be granted at once fails with LOCK_NOT_GRANTED (blocking waits are not
//! offered); READ and WRITE check the ranges other opens hold.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use smb_proto::msg::lock::{LOCKFLAG_EXCLUSIVE_LOCK, LOCKFLAG_SHARED_LOCK, LOCKFLAG_UNLOCK};
use smb_proto::msg::{LockRequest, LockResponse, Message as _};
use smb_proto::NtStatus;

use super::open::Open;
use super::status;
use crate::conn::Reply;
use crate::dispatch::Ctx;
use crate::state::FileKey;

const INVALID_LOCK_RANGE: NtStatus = NtStatus(0xC000_01A1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    open: u64,
    offset: u64,
    length: u64,
    exclusive: bool,
}

impl Range {
    /// Samba's overlap rule: a zero-length lock overlaps a range it falls inside, and two
    /// locks with the same start and length overlap even at the end of the 64-bit space.
    fn overlaps(&self, offset: u64, length: u64) -> bool {
        if self.length != 0 && self.offset == offset && self.length == length {
            return true;
        }
        let a_end = u128::from(self.offset) + u128::from(self.length);
        let b_end = u128::from(offset) + u128::from(length);
        !(u128::from(self.offset) >= b_end || u128::from(offset) >= a_end)
    }
}

#[derive(Debug, Default)]
pub struct LockTable {
    files: Mutex<HashMap<FileKey, Vec<Range>>>,
}

impl LockTable {
    /// Whether I/O by `open` on the range collides with another open's lock.
    pub fn conflicts(
        &self,
        key: FileKey,
        open: u64,
        offset: u64,
        length: u64,
        write: bool,
    ) -> bool {
        let files = self.files.lock();
        // A write collides with any other lock and with the open's own shared ones; a read
        // with other opens' exclusive locks.
        length != 0
            && files.get(&key).is_some_and(|l| {
                l.iter().any(|r| {
                    r.overlaps(offset, length)
                        && if write {
                            r.open != open || !r.exclusive
                        } else {
                            r.open != open && r.exclusive
                        }
                })
            })
    }

    pub fn release_open(&self, key: FileKey, open: u64) {
        let mut files = self.files.lock();
        if let Some(l) = files.get_mut(&key) {
            l.retain(|r| r.open != open);
            if l.is_empty() {
                files.remove(&key);
            }
        }
    }
}

pub fn lock(
    ctx: &Ctx<'_>,
    open: &Arc<Open>,
    req: &LockRequest,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    if req.locks.is_empty() {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let unlocking = req
        .locks
        .first()
        .is_some_and(|l| l.flags & LOCKFLAG_UNLOCK != 0);
    let mut files = ctx.server.locks.files.lock();
    let list = files.entry(open.key).or_default();
    let before = list.clone();
    for l in &req.locks {
        if l.offset.checked_add(l.length.saturating_sub(1)).is_none() {
            *list = before;
            return Err(INVALID_LOCK_RANGE);
        }
        let mode = l.flags & (LOCKFLAG_SHARED_LOCK | LOCKFLAG_EXCLUSIVE_LOCK | LOCKFLAG_UNLOCK);
        if unlocking {
            if mode != LOCKFLAG_UNLOCK {
                *list = before;
                return Err(NtStatus::INVALID_PARAMETER);
            }
            let pos = list.iter().position(|r| {
                r.open == open.volatile && r.offset == l.offset && r.length == l.length
            });
            match pos {
                Some(i) => {
                    list.remove(i);
                }
                None => {
                    *list = before;
                    return Err(status::RANGE_NOT_LOCKED);
                }
            }
            continue;
        }
        let exclusive = match mode {
            LOCKFLAG_SHARED_LOCK => false,
            LOCKFLAG_EXCLUSIVE_LOCK => true,
            _ => {
                *list = before;
                return Err(NtStatus::INVALID_PARAMETER);
            }
        };
        // Samba's brl_conflict: shared locks never collide, nor does a shared lock with
        // the same open's own locks.
        let clash = list.iter().any(|r| {
            (exclusive || (r.exclusive && r.open != open.volatile))
                && r.overlaps(l.offset, l.length)
        });
        if clash {
            *list = before;
            return Err(status::LOCK_NOT_GRANTED);
        }
        list.push(Range {
            open: open.volatile,
            offset: l.offset,
            length: l.length,
            exclusive,
        });
    }
    if list.is_empty() {
        files.remove(&open.key);
    }
    drop(files);
    LockResponse.encode(out);
    Ok(Reply::ok())
}
