//! Breaks that an operation on an open file starts and does not wait for: a write or a size
//! change (read caching goes), a rename or a delete (handle caching goes), a byte-range lock
//! (level II oplocks and read-only leases go). The holder table and the notifications are in
//! `oplock`.

use tokio::time::Instant;

use super::lease;
use smb_proto::msg::info::INFO_FILE;
use smb_proto::msg::SetInfoRequest;

use super::oplock::{deliver, Owner, Step};
use crate::state::{FileKey, Server};

/// An open wrote to the file or changed its size: other lease keys and oplocks lose read
/// caching (MS-FSA 2.1.5.4). The breaks are sent and not waited for.
pub fn break_readers(server: &Server, key: FileKey, writer: u64) {
    break_others(server, key, writer, lease::R, lease::break_on_write, true);
}

/// An open renames the file or marks it for deletion: other lease keys lose handle caching
/// (MS-FSA 2.1.5.14.11, 2.1.5.14.3), so their clients close the handles they keep cached.
/// The breaks are sent and not waited for: the rename or delete goes on at once.
pub fn break_handles(server: &Server, key: FileKey, actor: u64) {
    break_others(server, key, actor, lease::H, |s| s & !lease::H, false);
}

/// Whether a SET_INFO renames the file or marks it for deletion (FileRenameInformation,
/// FileDispositionInformation or FileDispositionInformationEx with the delete flag): then it
/// waits for the handle-caching breaks of other holders first.
pub fn renames_or_deletes(req: &SetInfoRequest<'_>) -> bool {
    if req.info_type != INFO_FILE {
        return false;
    }
    match req.file_info_class {
        10 => true,
        13 => req.buffer.first().is_some_and(|b| *b != 0),
        64 => req.buffer.first().is_some_and(|b| b & 1 != 0),
        _ => false,
    }
}

/// Before a rename or a delete by the open `actor`: breaks the handle caching of other lease
/// keys and oplocks (MS-FSA 2.1.5.14.11, 2.1.5.14.3) and says whether acknowledgments are
/// outstanding: the rename or delete waits for them (or their timeout), so the holders close
/// the handles they kept open first, as on Windows (smbtorture smb2.lease.rename_wait).
pub fn start_handle_breaks(server: &Server, key: FileKey, actor: u64) -> Step {
    break_handles(server, key, actor);
    let files = server.files.lock();
    let Some(st) = files.get(&key) else {
        return Step::Proceed;
    };
    let deadline = st
        .holders
        .iter()
        .filter(|h| !h.opens.contains(&actor))
        .filter_map(|h| h.breaking.map(|(_, d)| d))
        .min();
    match deadline {
        Some(deadline) => Step::Wait {
            changed: st.changed.clone(),
            deadline,
        },
        None => Step::Proceed,
    }
}

/// Breaks the holders other than `actor`'s that hold any of `bits` to `to(state)`; with
/// `own_level_ii` the actor's own level II oplock too (MS-FSA 2.1.4.12: a write breaks every
/// level II oplock of the stream, smbtorture smb2.oplock.levelii500).
fn break_others(
    server: &Server,
    key: FileKey,
    actor: u64,
    bits: u32,
    to: fn(u32) -> u32,
    own_level_ii: bool,
) {
    let now = Instant::now();
    let mut sends = Vec::new();
    {
        let mut files = server.files.lock();
        let Some(st) = files.get_mut(&key) else {
            return;
        };
        for h in st.holders.iter_mut() {
            let level_ii = matches!(h.owner, Owner::Oplock { .. }) && h.state == lease::R;
            let own = h.opens.contains(&actor) && !(own_level_ii && level_ii);
            if own || h.breaking.is_some() || h.state & bits == 0 {
                continue;
            }
            let (target, ack) = match h.owner {
                Owner::Lease { .. } => (to(h.state), lease::lease_break_needs_ack(h.state)),
                // An oplock breaks to level II or none.
                Owner::Oplock { .. } => (
                    to(h.state) & lease::R,
                    lease::oplock_break_needs_ack(h.state),
                ),
            };
            sends.push(h.begin_break(target, ack, now));
        }
        st.holders
            .retain(|h| !(matches!(h.owner, Owner::Oplock { .. }) && h.state == 0));
    }
    for s in sends {
        deliver(server, s);
    }
}

/// An open takes a byte-range lock: read caching that is not write caching goes (MS-FSA
/// 2.1.4.12, BYTE_RANGE_LOCK): level II oplocks break to none, the locking open's own too, and
/// leases of other keys holding R (or RH) without W break to none. Exclusive and batch
/// oplocks and leases with write caching keep their state (the locker is alone on the file
/// or is their holder). The breaks are sent and not waited for.
pub fn break_on_lock(server: &Server, key: FileKey, locker: u64) {
    let now = Instant::now();
    let mut sends = Vec::new();
    {
        let mut files = server.files.lock();
        let Some(st) = files.get_mut(&key) else {
            return;
        };
        for h in st.holders.iter_mut() {
            if h.breaking.is_some() || h.state & lease::R == 0 || h.state & lease::W != 0 {
                continue;
            }
            let ack = match h.owner {
                Owner::Lease { .. } if h.opens.contains(&locker) => continue,
                Owner::Lease { .. } => lease::lease_break_needs_ack(h.state),
                Owner::Oplock { .. } => false,
            };
            sends.push(h.begin_break(0, ack, now));
        }
        st.holders
            .retain(|h| !(matches!(h.owner, Owner::Oplock { .. }) && h.state == 0));
    }
    for s in sends {
        deliver(server, s);
    }
}

#[cfg(test)]
#[path = "breaks_tests.rs"]
mod tests;
