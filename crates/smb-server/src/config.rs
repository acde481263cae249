//! The SMB part of the lanes configuration file: `[smb]` and `[[share]]`. Other sections belong
//! to the iSCSI parser and are skipped here. Errors name the file, line and key.
//!
//! ```toml
//! [smb]
//! enabled = true                    # default: true when a [[share]] exists
//! listen = ["0.0.0.0:445"]          # ADDR or ADDR:PORT, default port 445
//! users-file = "/var/lib/lanes/smb-users"   # default: <data-dir>/smb-users
//! link-speed = 10000                # Mbit/s reported for every interface (default: sysfs)
//! rss = true                        # report RSS capability for every interface
//! signing-required = false
//! min-dialect = "2.0.2"             # lowest dialect accepted: 2.0.2, 2.1, 3.0, 3.0.2, 3.1.1
//!
//! [[share]]
//! name = "data"
//! path = "/srv/data"
//! read-only = false
//! users = ["alice"]                 # default: every user of the users file
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

pub const DEFAULT_SMB_PORT: u16 = 445;
/// SMB 2.0.2: every dialect is accepted unless `min-dialect` says otherwise.
pub const DEFAULT_MIN_DIALECT: u16 = 0x0202;

/// Why the SMB configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}:{line}: {key}: {message}")]
    Invalid {
        file: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
    #[error("{file}:{line}: {message}")]
    Syntax {
        file: PathBuf,
        line: usize,
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareConfig {
    pub name: String,
    /// The directory the share exports.
    pub path: PathBuf,
    pub read_only: bool,
    /// Users allowed to connect; empty means every user.
    pub users: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmbConfig {
    pub listen: Vec<SocketAddr>,
    pub users_file: PathBuf,
    pub shares: Vec<ShareConfig>,
    /// Link speed override in bits per second for QUERY_NETWORK_INTERFACE_INFO.
    pub link_speed: Option<u64>,
    pub rss: bool,
    pub signing_required: bool,
    /// The lowest dialect a client may negotiate (0x0202, 0x0210, 0x0300, 0x0302 or 0x0311).
    /// The default, 2.0.2, accepts every dialect, as Samba and Windows Server do.
    pub min_dialect: u16,
    /// The NetBIOS-style name in the NTLM challenge.
    pub server_name: String,
}

impl SmbConfig {
    /// A configuration with defaults: listen on 0.0.0.0:445, users file under `data_dir`.
    pub fn new(data_dir: &Path) -> Self {
        SmbConfig {
            listen: vec![SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                DEFAULT_SMB_PORT,
            )],
            users_file: data_dir.join("smb-users"),
            shares: Vec::new(),
            link_speed: None,
            rss: false,
            signing_required: false,
            min_dialect: DEFAULT_MIN_DIALECT,
            server_name: "LANES".to_string(),
        }
    }

    /// Reads `[smb]` and `[[share]]` from a configuration file's text. None when SMB is off
    /// (no share, or `enabled = false`). Relative paths count from the file's directory.
    pub fn from_file_text(
        file: &Path,
        text: &str,
        data_dir: &Path,
    ) -> Result<Option<SmbConfig>, ConfigError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            file: file.to_path_buf(),
            line: e.span().map_or(1, |s| {
                text.get(..s.start.min(text.len()))
                    .map_or(1, |t| t.matches('\n').count() + 1)
            }),
            message: e.message().to_string(),
        })?;
        let base = file.parent().unwrap_or(Path::new("."));
        let line = |span: std::ops::Range<usize>| {
            text.get(..span.start.min(text.len()))
                .map_or(1, |t| t.matches('\n').count() + 1)
        };
        let invalid =
            |span: std::ops::Range<usize>, key: String, message: String| ConfigError::Invalid {
                file: file.to_path_buf(),
                line: line(span),
                key,
                message,
            };
        let mut cfg = SmbConfig::new(data_dir);
        let mut enabled = None;
        if let Some(smb) = raw.smb {
            enabled = smb.enabled;
            if let Some(list) = smb.listen {
                cfg.listen.clear();
                for (i, a) in list.into_iter().enumerate() {
                    let addr = parse_listen(a.get_ref())
                        .map_err(|m| invalid(a.span(), format!("smb.listen[{i}]"), m))?;
                    cfg.listen.push(addr);
                }
            }
            if let Some(p) = smb.users_file {
                cfg.users_file = base.join(p);
            }
            if let Some(s) = smb.link_speed {
                let mbit = u64::try_from(*s.get_ref())
                    .ok()
                    .filter(|v| *v > 0)
                    .ok_or_else(|| {
                        invalid(
                            s.span(),
                            "smb.link-speed".into(),
                            "must be a positive number of Mbit/s".into(),
                        )
                    })?;
                cfg.link_speed = Some(mbit.saturating_mul(1_000_000));
            }
            cfg.rss = smb.rss.unwrap_or(false);
            cfg.signing_required = smb.signing_required.unwrap_or(false);
            if let Some(d) = smb.min_dialect {
                cfg.min_dialect =
                    smb_proto::server::dialect::from_name(d.get_ref()).ok_or_else(|| {
                        invalid(
                            d.span(),
                            "smb.min-dialect".into(),
                            format!(
                                "{:?} is not a dialect (2.0.2, 2.1, 3.0, 3.0.2 or 3.1.1)",
                                d.get_ref()
                            ),
                        )
                    })?;
            }
            if let Some(n) = smb.server_name {
                cfg.server_name = n;
            }
        }
        for (i, s) in raw.share.into_iter().enumerate() {
            let span = s.span();
            let s = s.into_inner();
            let key = |k: &str| format!("share[{i}].{k}");
            let name = s
                .name
                .ok_or_else(|| invalid(span.clone(), key("name"), "missing".into()))?;
            let n = name.get_ref();
            if n.is_empty()
                || n.len() > 80
                || n.eq_ignore_ascii_case("IPC$")
                || n.chars()
                    .any(|c| "\\/:*?\"<>|".contains(c) || c.is_control())
            {
                return Err(invalid(
                    name.span(),
                    key("name"),
                    format!("{n:?} is not a valid share name"),
                ));
            }
            if cfg.shares.iter().any(|o| o.name.eq_ignore_ascii_case(n)) {
                return Err(invalid(
                    name.span(),
                    key("name"),
                    format!("duplicate share {n:?}"),
                ));
            }
            let path = s
                .path
                .ok_or_else(|| invalid(span.clone(), key("path"), "missing".into()))?;
            cfg.shares.push(ShareConfig {
                name: n.clone(),
                path: base.join(path.get_ref()),
                read_only: s.read_only.unwrap_or(false),
                users: s.users.unwrap_or_default(),
            });
        }
        if cfg.shares.is_empty() || enabled == Some(false) {
            return Ok(None);
        }
        Ok(Some(cfg))
    }
}

/// `ADDR`, `ADDR:PORT` or `[V6]:PORT`.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    text.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, DEFAULT_SMB_PORT))
        .map_err(|_| format!("{text:?} is not ADDR or ADDR:PORT"))
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RawFile {
    smb: Option<RawSmb>,
    #[serde(default)]
    share: Vec<Spanned<RawShare>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawSmb {
    enabled: Option<bool>,
    listen: Option<Vec<Spanned<String>>>,
    users_file: Option<String>,
    link_speed: Option<Spanned<i64>>,
    rss: Option<bool>,
    signing_required: Option<bool>,
    min_dialect: Option<Spanned<String>>,
    server_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawShare {
    name: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
    read_only: Option<bool>,
    users: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_and_errors() {
        let f = Path::new("/etc/lanes/lanes.toml");
        let text = "[server]\nx = 1\n[smb]\nlisten = [\"127.0.0.1:4450\", \"10.0.0.1\"]\nlink-speed = 1000\n[[share]]\nname = \"data\"\npath = \"d\"\nread-only = true\nusers = [\"a\"]\n";
        let c = SmbConfig::from_file_text(f, text, Path::new("/var/lib/lanes"))
            .unwrap()
            .unwrap();
        assert_eq!(c.listen[0], "127.0.0.1:4450".parse().unwrap());
        assert_eq!(c.listen[1].port(), 445);
        assert_eq!(c.link_speed, Some(1_000_000_000));
        assert_eq!(c.shares[0].path, PathBuf::from("/etc/lanes/d"));
        assert!(c.shares[0].read_only);
        assert_eq!(c.users_file, PathBuf::from("/var/lib/lanes/smb-users"));
        assert!(SmbConfig::from_file_text(f, "[server]\n", Path::new("/x"))
            .unwrap()
            .is_none());
        let bad = "[[share]]\nname = \"a\"\npath = \"b\"\n[[share]]\nname = \"A\"\npath = \"c\"\n";
        let e = SmbConfig::from_file_text(f, bad, Path::new("/x")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/lanes/lanes.toml:5: share[1].name: duplicate share \"A\""
        );
        let bad = "[smb]\nlisten = [\"nope\"]\n[[share]]\nname = \"a\"\npath = \"b\"\n";
        let e = SmbConfig::from_file_text(f, bad, Path::new("/x")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/etc/lanes/lanes.toml:2: smb.listen[0]"),
            "{e}"
        );
        assert_eq!(c.min_dialect, 0x0202);
        for (name, d) in [
            ("2.1", 0x0210),
            ("3.0", 0x0300),
            ("3.0.2", 0x0302),
            ("3.1.1", 0x0311),
        ] {
            let t =
                format!("[smb]\nmin-dialect = \"{name}\"\n[[share]]\nname = \"a\"\npath = \"b\"\n");
            let c = SmbConfig::from_file_text(f, &t, Path::new("/x"))
                .unwrap()
                .unwrap();
            assert_eq!(c.min_dialect, d);
        }
        let bad = "[smb]\nsigning-required = true\nmin-dialect = \"SMB3\"\n[[share]]\nname = \"a\"\npath = \"b\"\n";
        let e = SmbConfig::from_file_text(f, bad, Path::new("/x")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/lanes/lanes.toml:3: smb.min-dialect: \"SMB3\" is not a dialect (2.0.2, 2.1, 3.0, 3.0.2 or 3.1.1)"
        );
        let bad = "[[share]]\nname = \"a\"\npath = \"b\"\nwhat = 1\n";
        assert!(SmbConfig::from_file_text(f, bad, Path::new("/x")).is_err());
    }
}
