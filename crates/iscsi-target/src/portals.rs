//! Portal addresses as initiators should see them: a wildcard listener (0.0.0.0 or ::) stands
//! for every address of this host.

use crate::server::Portal;
use std::net::{IpAddr, SocketAddr};

/// This host's interface addresses of the given family.
fn local_addresses(v6: bool) -> Vec<IpAddr> {
    let mut out = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for ifa in addrs {
            let Some(addr) = ifa.address else { continue };
            if let (false, Some(sin)) = (v6, addr.as_sockaddr_in()) {
                out.push(IpAddr::V4(sin.ip()));
            }
            if let (true, Some(sin6)) = (v6, addr.as_sockaddr_in6()) {
                let ip = sin6.ip();
                // Link-local addresses need a scope id an initiator cannot use from SendTargets.
                if ip.segments()[0] & 0xffc0 != 0xfe80 {
                    out.push(IpAddr::V6(ip));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Replaces wildcard portals by one portal per local address (loopback included, listed last).
pub fn expand(portals: impl Iterator<Item = Portal>) -> Vec<Portal> {
    let mut out = Vec::new();
    for p in portals {
        if p.addr.ip().is_unspecified() {
            let mut addrs = local_addresses(p.addr.is_ipv6());
            addrs.sort_by_key(|a| a.is_loopback());
            for ip in addrs {
                out.push(Portal {
                    tpgt: p.tpgt,
                    addr: SocketAddr::new(ip, p.addr.port()),
                });
            }
        } else {
            out.push(p);
        }
    }
    out.dedup();
    out
}

/// Addresses to report in SendTargets for portal group `tag`, to an initiator connected to
/// `local`: loopback addresses only to a loopback client (others could not reach them).
pub fn reportable(all: &[Portal], tag: u16, local: SocketAddr) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = all
        .iter()
        .filter(|p| p.tpgt == tag)
        .filter(|p| !p.addr.ip().is_loopback() || local.ip().is_loopback())
        .map(|p| p.addr)
        .collect();
    if out.is_empty() {
        out.push(local);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn portal(tpgt: u16, addr: &str) -> Portal {
        Portal {
            tpgt,
            addr: addr.parse().unwrap(),
        }
    }

    #[test]
    fn send_targets_leaves_loopback_out_for_a_remote_initiator() {
        // A wildcard portal expanded: the host's address, then loopback.
        let all = [portal(1, "192.0.2.10:3260"), portal(1, "127.0.0.1:3260")];
        let remote = reportable(&all, 1, "192.0.2.10:3260".parse().unwrap());
        assert_eq!(remote, vec!["192.0.2.10:3260".parse().unwrap()]);
        let local = reportable(&all, 1, "127.0.0.1:3260".parse().unwrap());
        assert_eq!(local.len(), 2);
        // Another group's portals are not this group's.
        assert!(reportable(&all, 2, "192.0.2.10:3260".parse().unwrap())
            .iter()
            .all(|a| *a == "192.0.2.10:3260".parse().unwrap()));
    }

    #[test]
    fn expanded_wildcards_list_loopback_last() {
        let expanded = expand([portal(1, "0.0.0.0:3260")].into_iter());
        assert!(!expanded.is_empty());
        let first_loopback = expanded.iter().position(|p| p.addr.ip().is_loopback());
        if let Some(i) = first_loopback {
            assert!(expanded[i..].iter().all(|p| p.addr.ip().is_loopback()));
        }
        assert!(expanded
            .iter()
            .all(|p| p.tpgt == 1 && p.addr.port() == 3260));
    }
}
