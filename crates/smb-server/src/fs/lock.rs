//! Byte-range locks (MS-SMB2 3.3.5.14): shared and exclusive ranges per file, owned by an open.
//! A lock that cannot be granted at once fails with LOCK_NOT_GRANTED when the client asks to
//! fail immediately (or sends several locks); a single blocking lock waits (the connection
//! answers STATUS_PENDING and `Conn::lock_async` retries it whenever a range of the file is
//! released). READ and WRITE check the ranges other opens hold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use smb_proto::msg::lock::{
    LockElement, LOCKFLAG_EXCLUSIVE_LOCK, LOCKFLAG_FAIL_IMMEDIATELY, LOCKFLAG_SHARED_LOCK,
    LOCKFLAG_UNLOCK,
};
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
    /// Woken when a range of the file is released, for the blocking locks waiting on it.
    released: Mutex<HashMap<FileKey, Arc<tokio::sync::Notify>>>,
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
        drop(files);
        self.wake(key);
    }

    /// What a blocking lock on `key` waits on.
    pub fn waiter(&self, key: FileKey) -> Arc<tokio::sync::Notify> {
        self.released.lock().entry(key).or_default().clone()
    }

    /// A blocking lock that has finished lets go of its file's notifier (the last one drops it).
    pub fn unwait(&self, key: FileKey, waiter: Arc<tokio::sync::Notify>) {
        let mut map = self.released.lock();
        // Held by the map and by `waiter`: nobody else waits.
        if Arc::strong_count(&waiter) <= 2 {
            map.remove(&key);
        }
    }

    fn wake(&self, key: FileKey) {
        if let Some(n) = self.released.lock().get(&key) {
            n.notify_waiters();
        }
    }

    /// Applies the elements of one LOCK request in order (MS-SMB2 3.3.5.14.1, 3.3.5.14.2): a
    /// request either unlocks or locks (the first element decides; an element of the other
    /// kind is INVALID_PARAMETER). Unlocks done before a failing element stay done; locks
    /// taken before a failing element are undone.
    pub fn apply(&self, key: FileKey, open: u64, locks: &[LockElement]) -> Result<(), NtStatus> {
        let unlocking = locks
            .first()
            .is_some_and(|l| l.flags & LOCKFLAG_UNLOCK != 0);
        let mut files = self.files.lock();
        let list = files.entry(key).or_default();
        // Locks are pushed at the end: undoing them is a truncation.
        let before = list.len();
        let mut result = Ok(());
        for l in locks {
            if l.offset.checked_add(l.length.saturating_sub(1)).is_none() {
                result = Err(INVALID_LOCK_RANGE);
                break;
            }
            if !valid_flags(l.flags) {
                result = Err(NtStatus::INVALID_PARAMETER);
                break;
            }
            let mode = l.flags & (LOCKFLAG_SHARED_LOCK | LOCKFLAG_EXCLUSIVE_LOCK | LOCKFLAG_UNLOCK);
            if unlocking {
                if mode != LOCKFLAG_UNLOCK {
                    result = Err(NtStatus::INVALID_PARAMETER);
                    break;
                }
                let pos = list
                    .iter()
                    .position(|r| r.open == open && r.offset == l.offset && r.length == l.length);
                match pos {
                    Some(i) => {
                        list.remove(i);
                    }
                    None => {
                        result = Err(status::RANGE_NOT_LOCKED);
                        break;
                    }
                }
                continue;
            }
            // Only a lone lock may wait; in a request of several each must fail at once.
            if locks.len() > 1 && l.flags & LOCKFLAG_FAIL_IMMEDIATELY == 0 {
                result = Err(NtStatus::INVALID_PARAMETER);
                break;
            }
            let exclusive = match mode {
                LOCKFLAG_SHARED_LOCK => false,
                LOCKFLAG_EXCLUSIVE_LOCK => true,
                _ => {
                    result = Err(NtStatus::INVALID_PARAMETER);
                    break;
                }
            };
            // Samba's brl_conflict: shared locks never collide, nor does a shared lock with
            // the same open's own locks.
            let clash = list.iter().any(|r| {
                (exclusive || (r.exclusive && r.open != open)) && r.overlaps(l.offset, l.length)
            });
            if clash {
                result = Err(status::LOCK_NOT_GRANTED);
                break;
            }
            list.push(Range {
                open,
                offset: l.offset,
                length: l.length,
                exclusive,
            });
        }
        if result.is_err() && !unlocking {
            list.truncate(before);
        }
        let released = unlocking && list.len() < before;
        if list.is_empty() {
            files.remove(&key);
        }
        drop(files);
        if released {
            self.wake(key);
        }
        result
    }
}

/// The flag combinations MS-SMB2 3.3.5.14 allows: a shared or exclusive lock, either with
/// FAIL_IMMEDIATELY, or an unlock alone. Any other bit or mix is INVALID_PARAMETER.
fn valid_flags(flags: u32) -> bool {
    const S: u32 = LOCKFLAG_SHARED_LOCK;
    const X: u32 = LOCKFLAG_EXCLUSIVE_LOCK;
    const F: u32 = LOCKFLAG_FAIL_IMMEDIATELY;
    [S, X, S | F, X | F, LOCKFLAG_UNLOCK].contains(&flags)
}

/// Open.LockSequenceArray (MS-SMB2 3.3.1.10, 3.3.5.14): the last lock sequence number done
/// under each of the 64 indexes, so a LOCK replayed on another channel after a lost one is
/// answered SUCCESS without being applied twice. Checked for every open: the server is SMB
/// 3.x with MULTI_CHANNEL.
#[derive(Debug)]
pub struct LockSequences([AtomicU8; 64]);

/// An entry with no valid sequence number (numbers are 4 bits).
const NO_SEQUENCE: u8 = 0xFF;

impl Default for LockSequences {
    fn default() -> Self {
        LockSequences(std::array::from_fn(|_| AtomicU8::new(NO_SEQUENCE)))
    }
}

impl LockSequences {
    /// The entry `lock_sequence` names (LockSequenceIndex 1 to 64) and its number.
    fn entry(&self, lock_sequence: u32) -> Option<(&AtomicU8, u8)> {
        let index = (lock_sequence >> 4) as usize;
        let number = (lock_sequence & 0xF) as u8;
        let slot = self.0.get(index.checked_sub(1)?)?;
        Some((slot, number))
    }
    /// Whether the request was done already (a replay).
    pub fn is_replay(&self, lock_sequence: u32) -> bool {
        self.entry(lock_sequence)
            .is_some_and(|(slot, n)| slot.load(Ordering::Acquire) == n)
    }
    /// Before a request is applied: its entry is no longer valid.
    pub fn begin(&self, lock_sequence: u32) {
        if let Some((slot, _)) = self.entry(lock_sequence) {
            slot.store(NO_SEQUENCE, Ordering::Release);
        }
    }
    /// A request that succeeded: its number is kept for replays.
    pub fn done(&self, lock_sequence: u32) {
        if let Some((slot, n)) = self.entry(lock_sequence) {
            slot.store(n, Ordering::Release);
        }
    }
}

/// A request that may wait for its lock: one element, a lock without FAIL_IMMEDIATELY.
pub fn may_block(req: &LockRequest) -> bool {
    match req.locks.as_slice() {
        [l] => l.flags & (LOCKFLAG_FAIL_IMMEDIATELY | LOCKFLAG_UNLOCK) == 0,
        _ => false,
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
    let sequences = &open.lock_sequences;
    if !sequences.is_replay(req.lock_sequence) {
        sequences.begin(req.lock_sequence);
        ctx.server
            .locks
            .apply(open.key, open.volatile, &req.locks)?;
        sequences.done(req.lock_sequence);
        if req.locks.iter().any(|l| l.flags & LOCKFLAG_UNLOCK == 0) {
            crate::fs::oplock::break_on_lock(ctx.server, open.key, open.volatile);
        }
    }
    LockResponse.encode(out);
    Ok(Reply::ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: FileKey = (1, 2);

    fn el(offset: u64, flags: u32) -> LockElement {
        LockElement {
            offset,
            length: 10,
            flags,
        }
    }
    const X: u32 = LOCKFLAG_EXCLUSIVE_LOCK | LOCKFLAG_FAIL_IMMEDIATELY;
    const U: u32 = LOCKFLAG_UNLOCK;

    fn held(t: &LockTable, open: u64, offset: u64) -> bool {
        t.conflicts(KEY, open + 1, offset, 1, false)
    }

    #[test]
    fn an_unlock_with_another_flag_or_an_unknown_bit_is_invalid() {
        let t = LockTable::default();
        assert_eq!(t.apply(KEY, 1, &[el(0, X)]), Ok(()));
        for bad in [
            U | LOCKFLAG_FAIL_IMMEDIATELY,
            U | LOCKFLAG_EXCLUSIVE_LOCK,
            U | LOCKFLAG_SHARED_LOCK,
            LOCKFLAG_SHARED_LOCK | LOCKFLAG_EXCLUSIVE_LOCK,
            LOCKFLAG_FAIL_IMMEDIATELY,
            0,
            0x100 | X,
        ] {
            assert_eq!(
                t.apply(KEY, 1, &[el(0, bad)]),
                Err(NtStatus::INVALID_PARAMETER),
                "{bad:#x}"
            );
        }
        assert!(
            held(&t, 1, 0),
            "nothing was unlocked by the refused requests"
        );
        assert_eq!(t.apply(KEY, 1, &[el(0, U)]), Ok(()));
    }

    #[test]
    fn several_locks_in_one_request_must_each_fail_immediately() {
        let t = LockTable::default();
        let shared = LOCKFLAG_SHARED_LOCK;
        let f = LOCKFLAG_FAIL_IMMEDIATELY;
        assert_eq!(
            t.apply(KEY, 1, &[el(0, shared | f), el(20, shared)]),
            Err(NtStatus::INVALID_PARAMETER)
        );
        assert!(!held(&t, 1, 0), "the first lock was undone");
        assert_eq!(t.apply(KEY, 1, &[el(0, shared | f), el(20, X)]), Ok(()));
        assert_eq!(
            t.apply(KEY, 1, &[el(40, shared)]),
            Ok(()),
            "a lone lock may wait"
        );
    }

    #[test]
    fn unlocks_before_a_failing_element_stay_done() {
        let t = LockTable::default();
        t.apply(KEY, 1, &[el(10, X)]).unwrap();
        // The first element is not locked: nothing is unlocked.
        assert_eq!(
            t.apply(KEY, 1, &[el(0, U), el(10, U)]),
            Err(status::RANGE_NOT_LOCKED)
        );
        assert!(held(&t, 1, 10));
        // The second is not locked: the first stays unlocked.
        assert_eq!(
            t.apply(KEY, 1, &[el(10, U), el(0, U)]),
            Err(status::RANGE_NOT_LOCKED)
        );
        assert!(!held(&t, 1, 10));
    }

    #[test]
    fn locks_before_a_failing_element_are_undone() {
        let t = LockTable::default();
        t.apply(KEY, 2, &[el(10, X)]).unwrap();
        assert_eq!(
            t.apply(KEY, 1, &[el(0, X), el(10, X)]),
            Err(status::LOCK_NOT_GRANTED)
        );
        assert!(!held(&t, 1, 0), "the first lock was undone");
        // A lock then an unlock in one request: INVALID_PARAMETER, the lock undone.
        assert_eq!(
            t.apply(KEY, 1, &[el(0, X), el(10, U)]),
            Err(NtStatus::INVALID_PARAMETER)
        );
        assert!(!held(&t, 1, 0));
        assert!(held(&t, 2, 10), "the other open's lock is untouched");
        // An unlock then a lock: the unlock stays done.
        assert_eq!(
            t.apply(KEY, 2, &[el(10, U), el(0, X)]),
            Err(NtStatus::INVALID_PARAMETER)
        );
        assert!(!held(&t, 2, 10));
    }

    #[test]
    fn only_a_single_lock_without_fail_immediately_may_block() {
        let req = |locks: Vec<LockElement>| LockRequest {
            locks,
            ..LockRequest::default()
        };
        assert!(may_block(&req(vec![el(0, LOCKFLAG_EXCLUSIVE_LOCK)])));
        assert!(!may_block(&req(vec![el(0, X)])));
        assert!(!may_block(&req(vec![el(0, U)])));
        assert!(!may_block(&req(vec![
            el(0, LOCKFLAG_EXCLUSIVE_LOCK),
            el(10, LOCKFLAG_EXCLUSIVE_LOCK)
        ])));
    }

    #[tokio::test]
    async fn a_release_wakes_the_waiters_of_its_file_only() {
        let t = Arc::new(LockTable::default());
        t.apply(KEY, 1, &[el(0, X)]).unwrap();
        let waiter = t.waiter(KEY);
        let other = t.waiter((9, 9));
        {
            let woken = waiter.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let not_woken = other.notified();
            tokio::pin!(not_woken);
            not_woken.as_mut().enable();
            // A failed unlock releases nothing and wakes nobody.
            assert!(t.apply(KEY, 1, &[el(50, U)]).is_err());
            assert!(futures_poll(woken.as_mut()).is_pending());
            t.apply(KEY, 1, &[el(0, U)]).unwrap();
            assert!(futures_poll(woken.as_mut()).is_ready());
            assert!(futures_poll(not_woken.as_mut()).is_pending());
        }
        // The last waiter lets go of the notifier.
        t.unwait(KEY, waiter);
        assert!(!t.released.lock().contains_key(&KEY));
    }

    fn futures_poll<F: std::future::Future>(
        f: std::pin::Pin<&mut F>,
    ) -> std::task::Poll<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        f.poll(&mut cx)
    }
}

#[cfg(test)]
mod sequence_tests {
    use super::*;

    #[test]
    fn a_lock_sequence_done_is_a_replay_until_the_index_is_reused() {
        let s = LockSequences::default();
        let seq = |index: u32, number: u32| index << 4 | number;
        assert!(!s.is_replay(seq(1, 3)));
        s.begin(seq(1, 3));
        s.done(seq(1, 3));
        assert!(s.is_replay(seq(1, 3)), "the same index and number");
        assert!(!s.is_replay(seq(1, 4)), "another number");
        assert!(!s.is_replay(seq(2, 3)), "another index");
        // A request under the index that has begun and not finished invalidates the entry.
        s.begin(seq(1, 4));
        assert!(!s.is_replay(seq(1, 3)));
        assert!(!s.is_replay(seq(1, 4)));
        // Index 0 and indexes past 64 are not checked.
        for unchecked in [seq(0, 1), seq(65, 1)] {
            s.begin(unchecked);
            s.done(unchecked);
            assert!(!s.is_replay(unchecked));
        }
        s.done(seq(64, 15));
        assert!(s.is_replay(seq(64, 15)));
    }
}
