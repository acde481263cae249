//! SET_INFO: basic (times), end of file, allocation, rename, disposition; file-system and
//! security sets are accepted and ignored (the share's permissions are the server's).

use std::os::unix::fs::MetadataExt as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use smb_proto::msg::info::{INFO_FILE, INFO_FILESYSTEM, INFO_SECURITY};
use smb_proto::msg::{Message as _, SetInfoRequest, SetInfoResponse};
use smb_proto::NtStatus;

use super::open::{Open, DELETE};
use super::{io_status, status};
use crate::conn::Reply;
use crate::dispatch::Ctx;
use crate::wire::{from_filetime, u32_at, u64_at};

const WRITE_ATTRIBUTES: u32 = 0x0100;

pub fn set_info(
    ctx: &Ctx<'_>,
    open: &Arc<Open>,
    req: &SetInfoRequest<'_>,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    if ctx.tree.read_only {
        return Err(NtStatus::ACCESS_DENIED);
    }
    match req.info_type {
        INFO_FILE => file_class(ctx, open, req.file_info_class, req.buffer)?,
        INFO_FILESYSTEM | INFO_SECURITY => {}
        _ => return Err(NtStatus::INVALID_PARAMETER),
    }
    SetInfoResponse.encode(out);
    Ok(Reply::ok())
}

fn file_class(ctx: &Ctx<'_>, open: &Arc<Open>, class: u8, b: &[u8]) -> Result<(), NtStatus> {
    let short = status::INFO_LENGTH_MISMATCH;
    match class {
        4 => {
            if b.len() < 36 {
                return Err(short);
            }
            if open.access & WRITE_ATTRIBUTES == 0 {
                return Err(NtStatus::ACCESS_DENIED);
            }
            let t = |at| u64_at(b, at).unwrap_or(0);
            let ts = |ft: u64| {
                // 0 and -1 leave a time as it is (-2 too: "stop updating" is not kept).
                if ft == 0 || ft >= u64::MAX - 1 {
                    None
                } else {
                    let (s, n) = from_filetime(ft);
                    Some(rustix::fs::Timespec {
                        tv_sec: s,
                        tv_nsec: n,
                    })
                }
            };
            let (access, write) = (ts(t(8)), ts(t(16)));
            let attrs = u32_at(b, 32).unwrap_or(0);
            let given = |ft: u64| ft != 0 && ft < u64::MAX - 1;
            let (creation, change) = (t(0), t(24));
            use super::info::{Dos, ATTR_DIRECTORY, ATTR_KEPT, ATTR_TEMPORARY};
            if (open.is_dir && attrs & ATTR_TEMPORARY != 0)
                || (!open.is_dir && attrs & ATTR_DIRECTORY != 0)
            {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            if access.is_some() || write.is_some() {
                let omit = rustix::fs::Timespec {
                    tv_sec: 0,
                    tv_nsec: rustix::fs::UTIME_OMIT,
                };
                let times = rustix::fs::Timestamps {
                    last_access: access.unwrap_or(omit),
                    last_modification: write.unwrap_or(omit),
                };
                rustix::fs::futimens(&open.file, &times).map_err(|e| io_status(&e.into()))?;
            }
            if attrs != 0 || given(creation) || given(change) {
                let mut dos = Dos::of_file(&open.file);
                if attrs != 0 {
                    dos.attrs = Some(attrs & ATTR_KEPT);
                }
                if given(creation) {
                    dos.creation = creation;
                }
                if given(change) {
                    // Kept with the last write time it goes with (set above, if it was).
                    let m = open.file.metadata().map_err(|e| io_status(&e))?;
                    dos.change = change;
                    dos.change_at_write = crate::wire::filetime(m.mtime(), m.mtime_nsec());
                }
                dos.store(&open.file).map_err(|e| io_status(&e))?;
            }
        }
        19 => {
            // FileAllocationInformation: preallocation is not kept; shrinking truncates.
            let size = u64_at(b, 0).ok_or(short)?;
            let m = open.file.metadata().map_err(|e| io_status(&e))?;
            if !open.is_dir {
                // An allocation change breaks read caching as a size change does
                // (smb2.oplock.batch12).
                crate::fs::oplock::break_readers(ctx.server, open.key, open.volatile);
            }
            if !open.is_dir && size < m.len() {
                open.file.set_len(size).map_err(|e| io_status(&e))?;
            }
        }
        20 => {
            let size = u64_at(b, 0).ok_or(short)?;
            if open.is_dir {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            if !open.can_write() {
                return Err(NtStatus::ACCESS_DENIED);
            }
            crate::fs::oplock::break_readers(ctx.server, open.key, open.volatile);
            open.file.set_len(size).map_err(|e| io_status(&e))?;
        }
        10 => rename(ctx, open, b)?,
        13 | 64 => {
            let flag = *b.first().ok_or(short)?;
            let delete = if class == 64 {
                u32_at(b, 0).ok_or(short)? & 1 != 0
            } else {
                flag != 0
            };
            if open.access & DELETE == 0 {
                return Err(NtStatus::ACCESS_DENIED);
            }
            if delete {
                crate::fs::oplock::break_handles(ctx.server, open.key, open.volatile);
            }
            if delete && open.is_dir {
                let path = open.path.lock().clone();
                let empty = std::fs::read_dir(&path)
                    .map_err(|e| io_status(&e))?
                    .next()
                    .is_none();
                if !empty {
                    return Err(status::DIRECTORY_NOT_EMPTY);
                }
            }
            if let Some(st) = ctx.server.files.lock().get_mut(&open.key) {
                st.delete_pending = delete;
            }
            if !delete {
                open.delete_on_close.store(false, Ordering::Relaxed);
            }
        }
        14 => {
            let pos = u64_at(b, 0).ok_or(short)?;
            open.position.store(pos, Ordering::Relaxed);
        }
        16 | 39 => {}
        _ => return Err(status::INVALID_INFO_CLASS),
    }
    Ok(())
}

/// FILE_RENAME_INFORMATION_TYPE_2: ReplaceIfExists, RootDirectory (must be 0), the new name
/// relative to the share root.
fn rename(ctx: &Ctx<'_>, open: &Arc<Open>, b: &[u8]) -> Result<(), NtStatus> {
    if b.len() < 20 {
        return Err(status::INFO_LENGTH_MISMATCH);
    }
    if open.access & DELETE == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    let replace = b.first().copied().unwrap_or(0) != 0;
    let len = u32_at(b, 16).unwrap_or(0) as usize;
    let raw = b.get(20..20 + len).ok_or(NtStatus::INVALID_PARAMETER)?;
    let name = crate::wire::from_utf16(raw).ok_or(status::OBJECT_NAME_INVALID)?;
    let name = name.trim_start_matches('\\');
    if name.is_empty() {
        return Err(status::OBJECT_NAME_INVALID);
    }
    let r = super::path::resolve(&open.share.root, name)?;
    if parent_open_for_delete(ctx.server, std::path::Path::new(&r.path)) {
        return Err(status::SHARING_VIOLATION);
    }
    let from = open.path.lock().clone();
    if let Some(m) = &r.meta {
        if std::path::Path::new(&r.path) != from {
            if !replace {
                return Err(status::OBJECT_NAME_COLLISION);
            }
            if m.is_dir() {
                return Err(NtStatus::ACCESS_DENIED);
            }
            let key = {
                use std::os::unix::fs::MetadataExt as _;
                (m.dev(), m.ino())
            };
            if ctx
                .server
                .files
                .lock()
                .get(&key)
                .is_some_and(|f| !f.entries.is_empty())
            {
                return Err(NtStatus::ACCESS_DENIED);
            }
        }
    }
    if open.is_dir {
        // Open files below a directory keep their old paths: refuse to move it under them.
        let below = ctx
            .session
            .state
            .lock()
            .opens
            .values()
            .any(|o| o.volatile != open.volatile && o.path.lock().starts_with(&from));
        if below {
            return Err(NtStatus::ACCESS_DENIED);
        }
    }
    crate::fs::oplock::break_handles(ctx.server, open.key, open.volatile);
    std::fs::rename(&from, &r.path).map_err(|e| io_status(&e))?;
    ctx.server.changed(&from);
    ctx.server.changed(&r.path);
    *open.path.lock() = r.path;
    *open.name.lock() = r.name;
    Ok(())
}

/// Whether the directory a rename moves a file into is open with DELETE access: Windows
/// refuses such a rename with SHARING_VIOLATION (its rename opens the target directory for
/// adding a file without sharing delete; smbtorture smb2.oplock.batch19, batch20, exclusive6).
fn parent_open_for_delete(server: &crate::state::Server, target: &std::path::Path) -> bool {
    let Some(m) = target.parent().and_then(|p| std::fs::metadata(p).ok()) else {
        return false;
    };
    server
        .files
        .lock()
        .get(&(m.dev(), m.ino()))
        .is_some_and(|st| st.entries.iter().any(|e| e.access & DELETE != 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Server, ShareEntry};

    #[test]
    fn a_rename_into_a_directory_open_for_delete_is_a_sharing_violation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("new.dat");
        let s = Server::new(
            crate::config::SmbConfig::new(dir.path()),
            Vec::new(),
            crate::users::Users::new(),
        );
        assert!(!parent_open_for_delete(&s, &target));
        let m = std::fs::metadata(dir.path()).expect("metadata");
        let entry = |access| ShareEntry {
            open: 1,
            access,
            share_access: 7,
        };
        // Open for reading and writing only: the rename goes on.
        s.files
            .lock()
            .entry((m.dev(), m.ino()))
            .or_default()
            .entries
            .push(entry(0x0012_019F));
        assert!(!parent_open_for_delete(&s, &target));
        s.files
            .lock()
            .entry((m.dev(), m.ino()))
            .or_default()
            .entries
            .push(entry(0x001F_01FF));
        assert!(parent_open_for_delete(&s, &target));
    }

    #[test]
    fn an_allocation_set_breaks_level_ii_oplocks() {
        use crate::fs::durable::tests::{blank, ctx, env, request, session, tree, utf16};
        use crate::fs::lease::{OPLOCK_LEVEL_II, OPLOCK_NONE};
        let e = env();
        let s = session(&e.server, 1, "u");
        let t = tree(&e.share);
        let c = ctx(&e, &s, &t);
        let name = utf16("f.dat");
        let mut first = request(&name, OPLOCK_LEVEL_II, Vec::new());
        first.share_access = 7;
        let r = crate::fs::open::create(&c, &first, &mut blank()).expect("create");
        let holder = r.file_id.and_then(|f| s.open(f, t.id)).expect("open");
        let held = |st: &crate::state::FileState| st.holders.iter().any(|h| h.state != 0);
        assert!(e.server.files.lock().get(&holder.key).is_some_and(held));
        let mut second = request(&name, OPLOCK_NONE, Vec::new());
        second.share_access = 7;
        let r = crate::fs::open::create(&c, &second, &mut blank()).expect("second open");
        let other = r.file_id.and_then(|f| s.open(f, t.id)).expect("open");
        let size = 65536u64 * 8;
        let set = SetInfoRequest {
            info_type: INFO_FILE,
            file_info_class: 19,
            additional_information: 0,
            file_id: other.file_id(),
            buffer: &size.to_le_bytes(),
        };
        set_info(&c, &other, &set, &mut blank()).expect("set allocation");
        assert!(!e.server.files.lock().get(&holder.key).is_some_and(held));
    }
}
