//! `iscsi://[user%secret@]HOST[:PORT]/IQN/LUN` URLs, as libiscsi writes them.

use std::fmt;

/// A parsed iSCSI URL.
#[derive(Clone, PartialEq, Eq)]
pub struct IscsiUrl {
    /// Host name or address as written (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    pub target: String,
    pub lun: u64,
    /// One-way CHAP: (user, secret).
    pub chap: Option<(String, String)>,
}

impl fmt::Debug for IscsiUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret.
        f.debug_struct("IscsiUrl")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("target", &self.target)
            .field("lun", &self.lun)
            .field("chap_user", &self.chap.as_ref().map(|c| &c.0))
            .finish()
    }
}

/// Why a URL did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("'{0}' is not an iSCSI URL: expected iscsi://[user%secret@]HOST[:PORT]/IQN/LUN")]
    Scheme(String),
    #[error("missing host in '{0}'")]
    MissingHost(String),
    #[error("bad port '{0}': expected a number 1..=65535")]
    Port(String),
    #[error("missing target name in '{0}': expected iscsi://HOST[:PORT]/IQN/LUN")]
    MissingTarget(String),
    #[error("missing LUN in '{0}': expected iscsi://HOST[:PORT]/IQN/LUN")]
    MissingLun(String),
    #[error("bad LUN '{0}': expected a number")]
    Lun(String),
    #[error("bad credentials in '{0}': expected user%secret@")]
    Credentials(String),
}

impl IscsiUrl {
    /// `host:port` for connecting (IPv6 in brackets).
    pub fn portal(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl std::str::FromStr for IscsiUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, UrlError> {
        let rest = s
            .strip_prefix("iscsi://")
            .ok_or_else(|| UrlError::Scheme(s.to_string()))?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (chap, hostport) = match authority.rsplit_once('@') {
            Some((cred, hp)) => {
                let (user, secret) = cred
                    .split_once('%')
                    .filter(|(u, p)| !u.is_empty() && !p.is_empty())
                    .ok_or_else(|| UrlError::Credentials(s.replace(cred, "***")))?;
                (Some((user.to_string(), secret.to_string())), hp)
            }
            None => (None, authority),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| UrlError::MissingHost(s.to_string()))?;
            (h, after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(UrlError::MissingHost(s.to_string()));
        }
        let port = match port {
            None => 3260,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| UrlError::Port(p.to_string()))?,
        };
        let path = path.trim_end_matches('/');
        let (target, lun) = match path.rsplit_once('/') {
            Some((t, l)) => (t, l),
            None if path.is_empty() => return Err(UrlError::MissingTarget(s.to_string())),
            None => return Err(UrlError::MissingLun(s.to_string())),
        };
        if target.is_empty() {
            return Err(UrlError::MissingTarget(s.to_string()));
        }
        let lun = lun
            .parse::<u64>()
            .ok()
            .filter(|l| *l < 16384)
            .ok_or_else(|| UrlError::Lun(lun.to_string()))?;
        Ok(IscsiUrl {
            host: host.to_string(),
            port,
            target: target.to_string(),
            lun,
            chap,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libiscsi_urls() {
        let u: IscsiUrl = "iscsi://127.0.0.1:3261/iqn.2026-11.io.lanes:x/1"
            .parse()
            .unwrap();
        assert_eq!(u.host, "127.0.0.1");
        assert_eq!(u.port, 3261);
        assert_eq!(u.target, "iqn.2026-11.io.lanes:x");
        assert_eq!(u.lun, 1);
        assert_eq!(u.chap, None);
        let u: IscsiUrl = "iscsi://bob%s3cret@[::1]/iqn.a:b/0".parse().unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.port, 3260);
        assert_eq!(u.portal(), "[::1]:3260");
        assert_eq!(u.chap, Some(("bob".into(), "s3cret".into())));
        assert!(!format!("{u:?}").contains("s3cret"));
    }

    #[test]
    fn rejects_bad_urls() {
        use UrlError::*;
        let e = |s: &str| s.parse::<IscsiUrl>().unwrap_err();
        assert!(matches!(e("http://x/iqn/0"), Scheme(_)));
        assert!(matches!(e("iscsi:///iqn/0"), MissingHost(_)));
        assert!(matches!(e("iscsi://h:99999/iqn/0"), Port(_)));
        assert!(matches!(e("iscsi://h"), MissingTarget(_)));
        assert!(matches!(e("iscsi://h/iqn.a:b"), MissingLun(_)));
        assert!(matches!(e("iscsi://h/iqn.a:b/x"), Lun(_)));
        assert!(matches!(e("iscsi://bob@h/iqn.a:b/0"), Credentials(_)));
    }
}
