//! The users file: one `name:nthash-hex` line per user (the NT hash is MD4 of the UTF-16LE
//! password). It must not be readable by group or others; `add` writes it with mode 0600.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum UsersError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: {message}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: mode {mode:03o} lets other users read the password hashes; chmod 600 it", path.display())]
    Permissions { path: PathBuf, mode: u32 },
    #[error("invalid user name {0:?}")]
    Name(String),
}

/// User name (compared case-insensitively, as Windows does) to NT hash.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Users {
    map: HashMap<String, [u8; 16]>,
}

impl Users {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn insert(&mut self, name: &str, nt_hash: [u8; 16]) {
        self.map.insert(name.to_lowercase(), nt_hash);
    }
    pub fn insert_password(&mut self, name: &str, password: &str) {
        self.insert(name, smb_proto::auth::ntlm_server::nt_hash(password));
    }
    pub fn get(&self, name: &str) -> Option<[u8; 16]> {
        self.map.get(&name.to_lowercase()).copied()
    }
    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(&name.to_lowercase())
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// The user names (lower case).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(String::as_str)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Users, UsersError> {
        let mut users = Users::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |message: &str| UsersError::Line {
                path: path.to_path_buf(),
                line: i + 1,
                message: message.to_string(),
            };
            let (name, hash) = line
                .split_once(':')
                .ok_or_else(|| err("expected name:nthash"))?;
            check_name(name).map_err(|_| err("invalid user name"))?;
            let hash =
                parse_hex16(hash.trim()).ok_or_else(|| err("the NT hash is not 32 hex digits"))?;
            users.insert(name, hash);
        }
        Ok(users)
    }

    /// Loads the file, refusing one that group or others may read.
    pub fn load(path: &Path) -> Result<Users, UsersError> {
        let io = |source| UsersError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(UsersError::Permissions {
                path: path.to_path_buf(),
                mode,
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Users::parse(path, &text)
    }

    /// Adds or replaces `name` in the file at `path` (created with mode 0600), written to a
    /// temporary file and renamed over the old one.
    pub fn add_to_file(path: &Path, name: &str, password: &str) -> Result<(), UsersError> {
        check_name(name)?;
        let io = |source| UsersError::Io {
            path: path.to_path_buf(),
            source,
        };
        let old = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io(e)),
        };
        let mut out = String::new();
        for line in old.lines() {
            let keep = line
                .split_once(':')
                .is_none_or(|(n, _)| !n.trim().eq_ignore_ascii_case(name));
            if keep {
                out.push_str(line);
                out.push('\n');
            }
        }
        let hash = smb_proto::auth::ntlm_server::nt_hash(password);
        out.push_str(name);
        out.push(':');
        for b in hash {
            out.push_str(&format!("{b:02x}"));
        }
        out.push('\n');
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension("tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        f.write_all(out.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        Ok(())
    }
}

fn check_name(name: &str) -> Result<(), UsersError> {
    let bad = name.is_empty()
        || name.len() > 64
        || name
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || ":\\/@\"[]".contains(c));
    if bad {
        Err(UsersError::Name(name.to_string()))
    } else {
        Ok(())
    }
}

fn parse_hex16(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_round_trip_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("smb-users");
        Users::add_to_file(&p, "alice", "secret").unwrap();
        Users::add_to_file(&p, "bob", "x").unwrap();
        Users::add_to_file(&p, "Alice", "other").unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let u = Users::load(&p).unwrap();
        assert_eq!(u.len(), 2);
        assert_eq!(
            u.get("ALICE"),
            Some(smb_proto::auth::ntlm_server::nt_hash("other"))
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            Users::load(&p),
            Err(UsersError::Permissions { .. })
        ));
        assert!(Users::parse(&p, "a:zz\n").is_err());
        assert!(Users::add_to_file(&p, "a:b", "x").is_err());
    }

    #[test]
    fn known_nt_hash() {
        // MS-NLMP 4.2.2.1.2: NTOWFv1("Password").
        let mut u = Users::new();
        u.insert_password("user", "Password");
        assert_eq!(
            u.get("user").unwrap(),
            parse_hex16("a4f49c406510bdcab6824ee7c30fd852").unwrap()
        );
    }
}
