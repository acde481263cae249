//! Portal addresses as initiators should see them.
//!
//! The SendTargets rule for a wildcard listener (0.0.0.0 or ::), as LIO has it: the answer names
//! the address the discovery connection arrived on, not every address of the machine. A host
//! that discovers on each of its storage links' addresses and then logs in to every node it
//! learned (`iscsiadm -m node --login`) then gets exactly one session per link; answering with
//! every address would add the management address (reachable through one of the data links,
//! so two sessions share a NIC). Explicit portals are always reported as configured. A host
//! that wants every path of a wildcard portal asks each address (the banner and `lanes doctor`
//! print one discovery per address; `lanes attach` takes `--portal` for each).

use crate::server::Portal;
use std::net::{IpAddr, SocketAddr};

/// This host's interface addresses of the given family, with their interface names.
fn local_addresses(v6: bool) -> Vec<(IpAddr, String)> {
    let mut out = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for ifa in addrs {
            let Some(addr) = ifa.address else { continue };
            if let (false, Some(sin)) = (v6, addr.as_sockaddr_in()) {
                out.push((IpAddr::V4(sin.ip()), ifa.interface_name.clone()));
            }
            if let (true, Some(sin6)) = (v6, addr.as_sockaddr_in6()) {
                let ip = sin6.ip();
                // Link-local addresses need a scope id an initiator cannot use from SendTargets.
                if ip.segments()[0] & 0xffc0 != 0xfe80 {
                    out.push((IpAddr::V6(ip), ifa.interface_name.clone()));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Interfaces that hold a default route (IPv4 from /proc/net/route, IPv6 from
/// /proc/net/ipv6_route): where a machine's management traffic leaves.
fn default_route_interfaces() -> Vec<String> {
    let v4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let v6 = std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default();
    let mut out = default_route_interfaces_in(&v4, &v6);
    out.sort();
    out.dedup();
    out
}

fn default_route_interfaces_in(route: &str, ipv6_route: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in route.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
        if f.len() > 7 && f[1] == "00000000" && f[7] == "00000000" {
            out.push(f[0].to_string());
        }
    }
    for line in ipv6_route.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // dest prefixlen src srcprefixlen nexthop metric refcnt use flags iface
        if f.len() == 10 && f[0].bytes().all(|b| b == b'0') && f[1] == "00" && f[9] != "lo" {
            out.push(f[9].to_string());
        }
    }
    out
}

/// What a wildcard portal stands for on this machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expanded {
    /// One portal per local address (loopback included, listed last).
    pub portals: Vec<Portal>,
    /// The subset that came from a wildcard and sits on an interface holding a default route.
    pub management: Vec<SocketAddr>,
}

/// Replaces wildcard portals by one portal per local address.
pub fn expand(portals: impl Iterator<Item = Portal>) -> Expanded {
    let routed = default_route_interfaces();
    let mut out = Expanded::default();
    for p in portals {
        if p.addr.ip().is_unspecified() {
            let mut addrs = local_addresses(p.addr.is_ipv6());
            addrs.sort_by_key(|(a, _)| a.is_loopback());
            for (ip, interface) in addrs {
                let addr = SocketAddr::new(ip, p.addr.port());
                out.portals.push(Portal { tpgt: p.tpgt, addr });
                if routed.contains(&interface) && !ip.is_loopback() {
                    out.management.push(addr);
                }
            }
        } else {
            out.portals.push(p);
        }
    }
    out.portals.dedup();
    out.management.sort();
    out.management.dedup();
    out
}

/// Addresses to report in SendTargets for portal group `tag` (bound portals, wildcards not
/// expanded) to an initiator whose connection arrived on `local`: a wildcard portal is reported
/// as the address the connection arrived on; loopback addresses only to a loopback client
/// (others could not reach them).
pub fn reportable(bound: &[Portal], tag: u16, local: SocketAddr) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for p in bound.iter().filter(|p| p.tpgt == tag) {
        let addr = if p.addr.ip().is_unspecified() {
            if p.addr.is_ipv6() != local.is_ipv6() {
                continue;
            }
            SocketAddr::new(local.ip(), p.addr.port())
        } else {
            p.addr
        };
        if (!addr.ip().is_loopback() || local.ip().is_loopback()) && !out.contains(&addr) {
            out.push(addr);
        }
    }
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

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn send_targets_leaves_loopback_out_for_a_remote_initiator() {
        let all = [portal(1, "192.0.2.10:3260"), portal(1, "127.0.0.1:3260")];
        let remote = reportable(&all, 1, addr("192.0.2.10:3260"));
        assert_eq!(remote, vec![addr("192.0.2.10:3260")]);
        let local = reportable(&all, 1, addr("127.0.0.1:3260"));
        assert_eq!(local.len(), 2);
        // Another group's portals are not this group's.
        assert_eq!(
            reportable(&all, 2, addr("192.0.2.10:3260")),
            vec![addr("192.0.2.10:3260")]
        );
    }

    #[test]
    fn a_wildcard_portal_is_reported_as_the_address_discovery_arrived_on() {
        let bound = [portal(1, "0.0.0.0:3260")];
        assert_eq!(
            reportable(&bound, 1, addr("10.0.2.1:3260")),
            vec![addr("10.0.2.1:3260")]
        );
        // Another group with a wildcard on another port: the same address, its port.
        let two = [portal(1, "0.0.0.0:3260"), portal(2, "0.0.0.0:3261")];
        assert_eq!(
            reportable(&two, 2, addr("10.0.2.1:3260")),
            vec![addr("10.0.2.1:3261")]
        );
        // Explicit portals of the group are still reported beside it.
        let mixed = [portal(1, "0.0.0.0:3260"), portal(1, "192.0.2.7:3260")];
        assert_eq!(
            reportable(&mixed, 1, addr("10.0.2.1:3260")),
            vec![addr("10.0.2.1:3260"), addr("192.0.2.7:3260")]
        );
        // An IPv6 wildcard says nothing to an IPv4 connection.
        let v6 = [portal(1, "[::]:3260")];
        assert_eq!(
            reportable(&v6, 1, addr("10.0.2.1:3260")),
            vec![addr("10.0.2.1:3260")]
        );
    }

    #[test]
    fn expanded_wildcards_list_loopback_last() {
        let expanded = expand([portal(1, "0.0.0.0:3260")].into_iter()).portals;
        assert!(!expanded.is_empty());
        let first_loopback = expanded.iter().position(|p| p.addr.ip().is_loopback());
        if let Some(i) = first_loopback {
            assert!(expanded[i..].iter().all(|p| p.addr.ip().is_loopback()));
        }
        assert!(expanded
            .iter()
            .all(|p| p.tpgt == 1 && p.addr.port() == 3260));
    }

    #[test]
    fn default_routes_are_read_from_proc() {
        let route =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t00000000\t0102A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                     eth1\t0001000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eth2\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo\n\
                  20010db8000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth1\n";
        assert_eq!(
            default_route_interfaces_in(route, v6),
            vec!["eth0".to_string(), "eth2".to_string()]
        );
        assert!(default_route_interfaces_in("", "").is_empty());
    }
}
