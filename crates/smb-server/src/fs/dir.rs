//! QUERY_DIRECTORY: a directory's entries matched against the client's pattern (`*`, `?` and
//! the DOS wildcards `<`, `>`, `"`, case-insensitive), listed once per scan and handed out in
//! buffer-sized pieces.

use std::os::unix::fs::MetadataExt as _;
use std::sync::Arc;

use smb_proto::msg::info::{
    QUERY_DIRECTORY_REOPEN, QUERY_DIRECTORY_RESTART_SCANS, QUERY_DIRECTORY_RETURN_SINGLE_ENTRY,
};
use smb_proto::msg::{Message as _, QueryDirectoryRequest, QueryDirectoryResponse};
use smb_proto::NtStatus;

use super::info::{allocation, attributes, end_of_file, file_times, Dos};
use super::open::Open;
use super::status;
use crate::conn::Reply;
use crate::dispatch::Ctx;
use crate::wire::{pad8, patch_u32, put_u16, put_u32, put_u64, put_utf16};

pub struct Entry {
    name: String,
    meta: std::fs::Metadata,
    dos: Dos,
}

/// One scan of a directory: its matching entries and how far the client got.
pub struct Listing {
    entries: Vec<Entry>,
    next: usize,
}

/// Wildcard match, case-insensitive (MS-FSA 2.1.4.4, without 8.3 names). The set of name
/// positions reachable after each pattern character is carried forward, so time is
/// O(pattern x name) and there is no recursion, whatever a client sends as pattern.
pub fn matches(pattern: &[char], name: &[char]) -> bool {
    let n = name.len();
    let mut cur = vec![false; n + 1];
    let mut next = vec![false; n + 1];
    if let Some(c) = cur.first_mut() {
        *c = true;
    }
    let eq = |a: char, b: char| a == b || a.to_lowercase().eq(b.to_lowercase());
    for &p in pattern {
        next.iter_mut().for_each(|v| *v = false);
        let mut any = false;
        for i in 0..=n {
            if !cur.get(i).copied().unwrap_or(false) {
                continue;
            }
            match p {
                '*' | '<' => {
                    // Any number of characters from here on.
                    for v in next.iter_mut().skip(i) {
                        *v = true;
                    }
                    any = true;
                    break;
                }
                '?' | '>' => {
                    if i < n {
                        if let Some(v) = next.get_mut(i + 1) {
                            *v = true;
                        }
                    } else if p == '>' {
                        // DOS_QM matches nothing at the end of the name.
                        if let Some(v) = next.get_mut(i) {
                            *v = true;
                        }
                    }
                }
                '"' => {
                    // DOS_DOT: a dot, or nothing at the end of the name.
                    if name.get(i) == Some(&'.') {
                        if let Some(v) = next.get_mut(i + 1) {
                            *v = true;
                        }
                    } else if i == n {
                        if let Some(v) = next.get_mut(i) {
                            *v = true;
                        }
                    }
                }
                c => {
                    if name.get(i).is_some_and(|&x| eq(x, c)) {
                        if let Some(v) = next.get_mut(i + 1) {
                            *v = true;
                        }
                    }
                }
            }
        }
        std::mem::swap(&mut cur, &mut next);
        if !any && !cur.iter().any(|v| *v) {
            return false;
        }
    }
    cur.get(n).copied().unwrap_or(false)
}

fn scan(open: &Open, pattern: &str) -> Result<Listing, NtStatus> {
    let path = open.path.lock().clone();
    let pat: Vec<char> = pattern.chars().collect();
    let mut entries = Vec::new();
    let at_root = path == open.share.root;
    for dot in [".", ".."] {
        if matches(&pat, &dot.chars().collect::<Vec<_>>()) {
            let p = if dot == ".." && !at_root {
                path.join("..")
            } else {
                path.clone()
            };
            if let Ok(meta) = std::fs::metadata(&p) {
                let dos = Dos::of_path(&p);
                entries.push(Entry {
                    name: dot.to_string(),
                    meta,
                    dos,
                });
            }
        }
    }
    let rd = std::fs::read_dir(&path).map_err(|e| super::io_status(&e))?;
    let mut rest: Vec<Entry> = Vec::new();
    for e in rd.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let chars: Vec<char> = name.chars().collect();
        if !matches(&pat, &chars) {
            continue;
        }
        // Symlinks are listed by what they point at, and only when that stays in the share.
        let meta = match e.metadata() {
            Ok(m) if m.file_type().is_symlink() => match std::fs::canonicalize(e.path()) {
                Ok(t) if t.starts_with(&open.share.root) => match std::fs::metadata(&t) {
                    Ok(m) => m,
                    Err(_) => continue,
                },
                _ => continue,
            },
            Ok(m) => m,
            Err(_) => continue,
        };
        let dos = Dos::of_path(&e.path());
        rest.push(Entry { name, meta, dos });
    }
    rest.sort_by(|a, b| a.name.cmp(&b.name));
    entries.extend(rest);
    Ok(Listing { entries, next: 0 })
}

pub fn query_directory(
    _ctx: &Ctx<'_>,
    open: &Arc<Open>,
    req: &QueryDirectoryRequest<'_>,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    if !open.is_dir {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let class = req.file_information_class;
    if !matches!(class, 1 | 2 | 3 | 12 | 37 | 38) {
        return Err(status::INVALID_INFO_CLASS);
    }
    let pattern = req.pattern().map_err(|_| status::OBJECT_NAME_INVALID)?;
    let pattern = if pattern.is_empty() {
        "*".to_string()
    } else {
        pattern
    };
    let mut guard = open.listing.lock();
    let restart = req.flags & (QUERY_DIRECTORY_RESTART_SCANS | QUERY_DIRECTORY_REOPEN) != 0;
    let first = guard.is_none() || restart;
    if first {
        *guard = Some(scan(open, &pattern)?);
    }
    let Some(listing) = guard.as_mut() else {
        return Err(NtStatus::INVALID_PARAMETER);
    };
    if listing.next >= listing.entries.len() {
        return Err(if first && listing.entries.is_empty() {
            NtStatus::NO_SUCH_FILE
        } else {
            NtStatus::NO_MORE_FILES
        });
    }
    let max = req.output_buffer_length as usize;
    let single = req.flags & QUERY_DIRECTORY_RETURN_SINGLE_ENTRY != 0;
    let mut buf = Vec::with_capacity(max.min(64 * 1024));
    let mut last: Option<usize> = None;
    // A later QUERY_DIRECTORY on the same listing leaves out what was removed since the scan
    // (smbtorture smb2.dir.fixed deletes everything through another handle halfway).
    let dir = (!first).then(|| open.path.lock().clone());
    while let Some(e) = listing.entries.get(listing.next) {
        if let Some(dir) = &dir {
            let gone = e.name != "."
                && e.name != ".."
                && std::fs::symlink_metadata(dir.join(&e.name))
                    .is_err_and(|err| err.kind() == std::io::ErrorKind::NotFound);
            if gone {
                listing.next += 1;
                continue;
            }
        }
        let start = buf.len();
        if let Some(prev) = last {
            pad8(&mut buf, prev);
            let aligned = buf.len();
            patch_u32(&mut buf, prev, (aligned - prev) as u32);
        }
        let at = buf.len();
        encode_entry(&mut buf, class, e, listing.next as u32);
        if buf.len() > max {
            buf.truncate(start);
            if let Some(prev) = last {
                patch_u32(&mut buf, prev, 0);
            }
            break;
        }
        last = Some(at);
        listing.next += 1;
        if single {
            break;
        }
    }
    if last.is_none() {
        if listing.next >= listing.entries.len() {
            return Err(NtStatus::NO_MORE_FILES);
        }
        return Err(status::INFO_LENGTH_MISMATCH);
    }
    QueryDirectoryResponse { output: &buf }.encode(out);
    Ok(Reply::ok())
}

fn encode_entry(out: &mut Vec<u8>, class: u8, e: &Entry, index: u32) {
    let m = &e.meta;
    put_u32(out, 0);
    put_u32(out, index);
    if class == 12 {
        let at = out.len();
        put_u32(out, 0);
        let n = put_utf16(out, &e.name);
        patch_u32(out, at, n as u32);
        return;
    }
    let t = file_times(m, &e.dos);
    put_u64(out, t.creation);
    put_u64(out, t.last_access);
    put_u64(out, t.last_write);
    put_u64(out, t.change);
    put_u64(out, end_of_file(m));
    put_u64(out, allocation(m));
    put_u32(out, attributes(m, &e.dos));
    let name_len_at = out.len();
    put_u32(out, 0);
    if class != 1 {
        put_u32(out, 0); // EaSize
    }
    if class == 3 || class == 37 {
        // ShortNameLength, Reserved, ShortName (24 bytes: 12 UTF-16 units at most).
        let mut short = Vec::with_capacity(24);
        if let Some(s) = super::shortname::generated(&e.name) {
            put_utf16(&mut short, &s);
        }
        short.truncate(24);
        out.push(short.len() as u8);
        out.push(0);
        short.resize(24, 0);
        out.extend_from_slice(&short);
    }
    if class == 37 {
        put_u16(out, 0);
        put_u64(out, m.ino());
    }
    if class == 38 {
        put_u32(out, 0);
        put_u64(out, m.ino());
    }
    let n = put_utf16(out, &e.name);
    patch_u32(out, name_len_at, n as u32);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, n: &str) -> bool {
        matches(
            &p.chars().collect::<Vec<_>>(),
            &n.chars().collect::<Vec<_>>(),
        )
    }

    #[test]
    fn wildcards() {
        assert!(m("*", "abc"));
        assert!(m("*", ""));
        assert!(m("a?c", "ABC"));
        assert!(!m("a?c", "ac"));
        assert!(m("*.txt", "x.TXT"));
        assert!(!m("*.txt", "x.txt2"));
        assert!(m("a*b*c", "aXXbYYc"));
        assert!(m("foo", "FOO"));
        assert!(!m("foo", "fo"));
        assert!(m("a\"b", "a.b"));
        assert!(m("x>", "x"));
        assert!(m("<.txt", "a.b.txt"));
        // A hostile pattern stays cheap (exponential backtracking would not finish).
        let hostile = "*a".repeat(5000) + "b";
        let name = "a".repeat(255);
        assert!(!m(&hostile, &name));
        assert!(m(&"*".repeat(30000), &name));
    }
}
