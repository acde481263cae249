//! From a client's path to a path under the share root, never outside it.
//!
//! Names are split on `\`; empty, `.` and `..` components, `/`, NUL, wildcards and stream names
//! other than `::$DATA` are refused. Each existing component is looked up with `lstat`: a
//! symbolic link is followed only when its target, canonicalized, stays inside the share root.
//! Lookups are case-sensitive first; when a component does not exist under its exact name, a
//! single case-insensitive match in its directory is taken instead (Windows clients expect
//! case-insensitive names; a directory with two names differing only in case is answered by
//! the exact match only).

use std::path::{Path, PathBuf};

use smb_proto::NtStatus;

use super::status;

/// A resolved name.
#[derive(Debug)]
pub struct Resolved {
    pub path: PathBuf,
    /// The share-relative name with the on-disk case, `\`-separated ("" for the root).
    pub name: String,
    pub meta: Option<std::fs::Metadata>,
}

/// Splits and checks a client path; `allow_wild` lets the last component carry wildcards.
pub fn components(name: &str) -> Result<Vec<&str>, NtStatus> {
    let name = name.strip_suffix("::$DATA").unwrap_or(name);
    if name.is_empty() {
        return Ok(Vec::new());
    }
    if name.starts_with('\\') {
        return Err(status::OBJECT_NAME_INVALID);
    }
    let name = name.strip_suffix('\\').unwrap_or(name);
    let mut out = Vec::new();
    for c in name.split('\\') {
        if c == ".." {
            return Err(status::OBJECT_PATH_SYNTAX_BAD);
        }
        if c.is_empty()
            || c == "."
            || c.len() > 255
            || c.chars().any(|ch| "/:*?\"<>|".contains(ch) || ch == '\0')
        {
            return Err(status::OBJECT_NAME_INVALID);
        }
        out.push(c);
    }
    Ok(out)
}

/// Resolves `name` under `root` (canonical). A missing last component gives `meta: None`; a
/// missing directory before it is OBJECT_PATH_NOT_FOUND.
pub fn resolve(root: &Path, name: &str) -> Result<Resolved, NtStatus> {
    let comps = components(name)?;
    let mut path = root.to_path_buf();
    let mut shown = String::new();
    let n = comps.len();
    for (i, c) in comps.iter().enumerate() {
        let last = i + 1 == n;
        let exact = path.join(c);
        let (found, real) = match std::fs::symlink_metadata(&exact) {
            Ok(m) => (Some(m), c.to_string()),
            Err(_) => match case_insensitive(&path, c) {
                Some(real) => (std::fs::symlink_metadata(path.join(&real)).ok(), real),
                None => (None, c.to_string()),
            },
        };
        path.push(&real);
        if !shown.is_empty() {
            shown.push('\\');
        }
        shown.push_str(&real);
        let meta = match found {
            None if last => {
                return Ok(Resolved {
                    path,
                    name: shown,
                    meta: None,
                })
            }
            None => return Err(status::OBJECT_PATH_NOT_FOUND),
            Some(m) if m.file_type().is_symlink() => {
                let target =
                    std::fs::canonicalize(&path).map_err(|_| NtStatus::OBJECT_NAME_NOT_FOUND)?;
                if !target.starts_with(root) {
                    tracing::warn!(path = %path.display(), "SMB: symlink leaving the share refused");
                    return Err(NtStatus::ACCESS_DENIED);
                }
                std::fs::metadata(&target).map_err(|e| super::io_status(&e))?
            }
            Some(m) => m,
        };
        if !last && !meta.is_dir() {
            return Err(status::OBJECT_PATH_NOT_FOUND);
        }
        if last {
            return Ok(Resolved {
                path,
                name: shown,
                meta: Some(meta),
            });
        }
    }
    let meta = std::fs::metadata(&path).map_err(|e| super::io_status(&e))?;
    Ok(Resolved {
        path,
        name: shown,
        meta: Some(meta),
    })
}

fn case_insensitive(dir: &Path, name: &str) -> Option<String> {
    let want = name.to_lowercase();
    let mut hit = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        if let Some(n) = e.file_name().to_str() {
            if n.to_lowercase() == want {
                if hit.is_some() {
                    return None;
                }
                hit = Some(n.to_string());
            }
        }
    }
    hit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_leaves_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/File.txt"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
        std::os::unix::fs::symlink("sub", root.join("in")).unwrap();
        assert_eq!(
            resolve(&root, "..").unwrap_err(),
            status::OBJECT_PATH_SYNTAX_BAD
        );
        assert_eq!(
            resolve(&root, "sub\\..\\..\\x").unwrap_err(),
            status::OBJECT_PATH_SYNTAX_BAD
        );
        assert_eq!(
            resolve(&root, "\\etc").unwrap_err(),
            status::OBJECT_NAME_INVALID
        );
        assert_eq!(
            resolve(&root, "a/b").unwrap_err(),
            status::OBJECT_NAME_INVALID
        );
        assert_eq!(
            resolve(&root, "out\\passwd").unwrap_err(),
            NtStatus::ACCESS_DENIED
        );
        assert_eq!(resolve(&root, "out").unwrap_err(), NtStatus::ACCESS_DENIED);
        let r = resolve(&root, "in\\file.TXT").unwrap();
        assert_eq!(r.name, "in\\File.txt");
        assert!(r.meta.unwrap().is_file());
        let r = resolve(&root, "sub\\new").unwrap();
        assert!(r.meta.is_none());
        assert_eq!(
            resolve(&root, "nope\\new").unwrap_err(),
            status::OBJECT_PATH_NOT_FOUND
        );
        assert_eq!(resolve(&root, "").unwrap().path, root);
    }
}
