//! `smb://[DOMAIN;]USER@HOST[:PORT]/SHARE[/PATH]` as `lanes bench` and `lanes doctor` take it.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _};

use crate::error::SmbError;

pub const DEFAULT_PORT: u16 = 445;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmbUrl {
    pub domain: String,
    pub user: String,
    pub host: String,
    pub port: u16,
    pub share: String,
    /// A path inside the share, empty if none.
    pub path: String,
}

impl SmbUrl {
    pub fn parse(s: &str) -> Result<SmbUrl, SmbError> {
        let bad =
            |why: &str| SmbError::Usage(format!("{s}: {why} (want smb://USER@HOST[:PORT]/SHARE)"));
        let rest = s
            .strip_prefix("smb://")
            .ok_or_else(|| bad("not an smb:// URL"))?;
        let (who, rest) = rest.split_once('@').ok_or_else(|| bad("no USER@"))?;
        let (domain, user) = match who.split_once(';') {
            Some((d, u)) => (d.to_string(), u.to_string()),
            None => (String::new(), who.to_string()),
        };
        if user.is_empty() {
            return Err(bad("empty user"));
        }
        let (hostport, tail) = rest.split_once('/').ok_or_else(|| bad("no /SHARE"))?;
        let (share, path) = match tail.split_once('/') {
            Some((s, p)) => (s.to_string(), p.trim_matches('/').replace('/', "\\")),
            None => (tail.to_string(), String::new()),
        };
        if share.is_empty() {
            return Err(bad("empty share"));
        }
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad("bad port"))?,
                None => DEFAULT_PORT,
            };
            (h.to_string(), port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad("bad port"))?),
                None => (hostport.to_string(), DEFAULT_PORT),
            }
        };
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        Ok(SmbUrl {
            domain,
            user,
            host,
            port,
            share,
            path,
        })
    }

    /// The server's address: the host as an IP literal, or its first resolved address.
    pub fn addr(&self) -> Result<SocketAddr, SmbError> {
        if let Ok(ip) = self.host.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, self.port));
        }
        (self.host.as_str(), self.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| SmbError::Usage(format!("{}: no address", self.host)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = SmbUrl::parse("smb://alice@127.0.0.1:4455/share").unwrap();
        assert_eq!(
            (u.user.as_str(), u.port, u.share.as_str()),
            ("alice", 4455, "share")
        );
        assert_eq!(u.addr().unwrap(), "127.0.0.1:4455".parse().unwrap());
        let u = SmbUrl::parse("smb://CORP;bob@[::1]/data/dir/f.bin").unwrap();
        assert_eq!(
            (u.domain.as_str(), u.host.as_str(), u.port),
            ("CORP", "::1", 445)
        );
        assert_eq!(u.path, "dir\\f.bin");
        for bad in [
            "http://a@b/c",
            "smb://b/c",
            "smb://a@b",
            "smb://a@b:x/c",
            "smb://@b/c",
        ] {
            assert!(SmbUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
