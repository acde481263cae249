//! Access rules: which initiators (by iSCSI name or by network) may log in to a target.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use super::name::validate_iscsi_name;

/// One entry of a target's access list. A login is allowed when any rule matches; an empty list
/// allows everyone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AclRule {
    /// InitiatorName, compared case-insensitively (names are normalized to lowercase).
    Initiator(String),
    /// Source address of the connection.
    Network(IpNetwork),
}

impl AclRule {
    /// Whether a connection from `peer` logging in as `initiator_name` matches this rule.
    pub fn matches(&self, initiator_name: &str, peer: IpAddr) -> bool {
        match self {
            AclRule::Initiator(name) => name.eq_ignore_ascii_case(initiator_name),
            AclRule::Network(network) => network.contains(peer),
        }
    }

    /// Whether `rules` let this initiator in (empty = everyone).
    pub fn allows(rules: &[AclRule], initiator_name: &str, peer: IpAddr) -> bool {
        rules.is_empty() || rules.iter().any(|r| r.matches(initiator_name, peer))
    }
}

impl FromStr for AclRule {
    type Err = String;

    /// `iqn.…`/`eui.…`/`naa.…` is an initiator name; `10.0.0.0/24`, `fd00::/64` or a bare
    /// address is a network.
    fn from_str(text: &str) -> Result<AclRule, String> {
        let lower = text.to_ascii_lowercase();
        if ["iqn.", "eui.", "naa."]
            .iter()
            .any(|p| lower.starts_with(p))
        {
            validate_iscsi_name(&lower)?;
            return Ok(AclRule::Initiator(lower));
        }
        text.parse().map(AclRule::Network).map_err(|reason| {
            format!("{reason}; an ACL entry is an initiator name (iqn./eui./naa.) or a network")
        })
    }
}

impl fmt::Display for AclRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AclRule::Initiator(name) => f.write_str(name),
            AclRule::Network(network) => network.fmt(f),
        }
    }
}

/// An IPv4 or IPv6 network in CIDR notation; host bits must be zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNetwork {
    address: IpAddr,
    prefix_length: u8,
}

impl IpNetwork {
    pub fn new(address: IpAddr, prefix_length: u8) -> Result<IpNetwork, String> {
        let max = max_prefix(address);
        if prefix_length > max {
            return Err(format!(
                "prefix length /{prefix_length} is larger than /{max}"
            ));
        }
        let network = IpNetwork {
            address,
            prefix_length,
        };
        if network.masked(address) != address {
            return Err(format!(
                "{address}/{prefix_length} has host bits set (did you mean {}/{prefix_length}?)",
                network.masked(address)
            ));
        }
        Ok(network)
    }

    pub fn address(&self) -> IpAddr {
        self.address
    }

    pub fn prefix_length(&self) -> u8 {
        self.prefix_length
    }

    /// Whether `peer` is inside this network; IPv4-mapped IPv6 peers match IPv4 networks.
    pub fn contains(&self, peer: IpAddr) -> bool {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        peer.is_ipv4() == self.address.is_ipv4() && self.masked(peer) == self.address
    }

    fn masked(&self, address: IpAddr) -> IpAddr {
        match address {
            IpAddr::V4(v4) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix_length))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(v4) & mask).into())
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_length))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        }
    }
}

fn max_prefix(address: IpAddr) -> u8 {
    if address.is_ipv4() {
        32
    } else {
        128
    }
}

impl FromStr for IpNetwork {
    type Err = String;

    fn from_str(text: &str) -> Result<IpNetwork, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr = address
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| format!("{text:?} is not an IP address or CIDR network"))?;
        let prefix_length = match prefix {
            None => max_prefix(address),
            Some(prefix) => prefix
                .parse()
                .map_err(|_| format!("{text:?}: prefix length {prefix:?} is not a number"))?,
        };
        IpNetwork::new(address, prefix_length).map_err(|reason| format!("{text:?}: {reason}"))
    }
}

impl fmt::Display for IpNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix_length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rules() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let rule: AclRule = "10.0.0.0/24".parse().unwrap();
        assert!(rule.matches("x", ip("10.0.0.7")));
        assert!(rule.matches("x", ip("::ffff:10.0.0.7")));
        assert!(!rule.matches("x", ip("10.0.1.7")));
        let rule: AclRule = "fd00:1::/64".parse().unwrap();
        assert!(rule.matches("x", ip("fd00:1::9")));
        assert!(!rule.matches("x", ip("fd00:2::9")));
        let rule: AclRule = "192.0.2.5".parse().unwrap();
        assert_eq!(rule.to_string(), "192.0.2.5/32");
        let rule: AclRule = "iqn.2005-03.org.open-iscsi:ABC".parse().unwrap();
        assert!(rule.matches("iqn.2005-03.org.open-iscsi:abc", ip("127.0.0.1")));
        assert!(AclRule::allows(&[], "anyone", ip("127.0.0.1")));
        assert!("0.0.0.0/0".parse::<AclRule>().is_ok());
    }

    #[test]
    fn rejects_bad_networks() {
        for bad in [
            "10.0.0.1/24",
            "10.0.0.0/33",
            "10.0.0/24",
            "host.example",
            "::/129",
            "1/x",
        ] {
            assert!(bad.parse::<AclRule>().is_err(), "{bad:?} accepted");
        }
    }
}
