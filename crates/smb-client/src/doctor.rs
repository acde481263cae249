//! The checking half of `lanes doctor smb://`: negotiate and sign in, read what the server
//! offers (dialect, signing, encryption, SMB2_GLOBAL_CAP_MULTI_CHANNEL, the interface list
//! with link speeds and RSS/RDMA), bind a channel to every advertised interface, and say in
//! plain words why a client would not use several connections, the way the "multiple
//! connections are not established" troubleshooting goes. `advise` is a pure function of the
//! facts.

use std::net::SocketAddr;

use smb_proto::msg::ioctl::{NetworkInterface, NETWORK_INTERFACE_CAP_RSS};
use smb_proto::msg::negotiate::CAP_MULTI_CHANNEL;

use crate::error::SmbError;
use crate::session::{ClientConfig, Session};
use crate::url::SmbUrl;

/// One advertised interface and whether a channel could be bound to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceCheck {
    pub interface: NetworkInterface,
    /// `Ok(())` when a channel bound, else why not.
    pub bind: Result<(), String>,
}

/// What the server offered and what worked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorFacts {
    pub server: SocketAddr,
    pub dialect: u16,
    pub signing: String,
    pub server_requires_signing: bool,
    /// The cipher the server chose from our offer, if any.
    pub cipher: Option<String>,
    pub encrypted: bool,
    pub multichannel: bool,
    pub max_read: u32,
    pub max_write: u32,
    /// The interface list, or why it could not be read.
    pub interfaces: Result<Vec<InterfaceCheck>, String>,
}

/// Runs every check. Errors are returned only when the server cannot be reached or refuses
/// the sign-in or the share; everything after that is a fact in the report.
pub async fn gather(url: &SmbUrl, password: &str, encrypt: bool) -> Result<DoctorFacts, SmbError> {
    let server = url.addr()?;
    let mut cfg = ClientConfig::new(&url.user, password);
    cfg.domain = url.domain.clone();
    cfg.encrypt = encrypt;
    let session = Session::connect(server, cfg).await?;
    let tree = session.tree_connect(&url.host, &url.share).await?;
    let neg = session.negotiated().clone();
    let multichannel = neg.has(CAP_MULTI_CHANNEL);
    let interfaces = match tree.network_interfaces().await {
        Ok(list) => {
            let mut checks = Vec::new();
            for nic in list {
                let bind = if !multichannel {
                    Err("not tried: the server does not offer multichannel".to_string())
                } else {
                    let addr = SocketAddr::new(nic.address, server.port());
                    session
                        .bind_channel(addr)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                };
                checks.push(InterfaceCheck {
                    interface: nic,
                    bind,
                });
            }
            Ok(checks)
        }
        Err(e) => Err(e.to_string()),
    };
    Ok(DoctorFacts {
        server,
        dialect: neg.dialect,
        signing: format!("{:?}", neg.signing),
        server_requires_signing: neg.server_requires_signing(),
        cipher: neg.cipher.map(|c| format!("{c:?}")),
        encrypted: session.encrypted(),
        multichannel,
        max_read: neg.max_read_size,
        max_write: neg.max_write_size,
        interfaces,
    })
}

/// How a link speed reads: 1 Gbit/s, 2.5 Gbit/s, 100 Mbit/s.
pub fn speed(bits: u64) -> String {
    if bits >= 1_000_000_000 {
        format!("{} Gbit/s", bits as f64 / 1e9)
    } else {
        format!("{} Mbit/s", bits as f64 / 1e6)
    }
}

/// Concrete advice when a client would not use several connections; empty when all is well.
pub fn advise(f: &DoctorFacts) -> Vec<String> {
    let mut out = Vec::new();
    if !f.multichannel {
        out.push(
            "the server does not offer SMB2_GLOBAL_CAP_MULTI_CHANNEL: every client uses one \
             connection. Enable multichannel on the server (Samba: `server multi channel \
             support = yes`; Windows: Set-SmbServerConfiguration -EnableMultiChannel $true)."
                .to_string(),
        );
    }
    let list = match &f.interfaces {
        Ok(l) => l,
        Err(e) => {
            out.push(format!(
                "the server does not answer FSCTL_QUERY_NETWORK_INTERFACE_INFO ({e}): clients \
                 cannot discover other interfaces, so they stay on one connection."
            ));
            return out;
        }
    };
    match list.len() {
        0 => out.push("the server advertises no interface: clients stay on one connection.".into()),
        1 => {
            let nic = list.first().map(|c| c.interface);
            let rss = nic.is_some_and(|n| n.capability & NETWORK_INTERFACE_CAP_RSS != 0);
            if rss {
                out.push(
                    "only one interface is advertised; it is RSS-capable, so Windows opens up to \
                     4 connections to it, and Linux needs `-o multichannel,max_channels=N`. \
                     Add the other NICs' addresses to the server for more than one link."
                        .into(),
                );
            } else {
                out.push(
                    "only one interface is advertised and it is not RSS-capable: clients open a \
                     single connection. Advertise every NIC's address (lanes: list them in \
                     [smb] listen) or report RSS (lanes: `rss = true`)."
                        .into(),
                );
            }
        }
        _ => {}
    }
    let speeds: Vec<u64> = list.iter().map(|c| c.interface.link_speed).collect();
    if let (Some(max), Some(min)) = (speeds.iter().max(), speeds.iter().min()) {
        if max != min {
            let slow: Vec<String> = list
                .iter()
                .filter(|c| c.interface.link_speed < *max)
                .map(|c| {
                    format!(
                        "{} ({})",
                        c.interface.address,
                        speed(c.interface.link_speed)
                    )
                })
                .collect();
            out.push(format!(
                "interfaces advertise different link speeds: clients use only the fastest \
                 ({}) and leave {} idle. Report the same speed for links that should share the \
                 load (lanes: `link-speed` in [smb]).",
                speed(*max),
                slow.join(", ")
            ));
        }
        if *min == 0 {
            out.push("an interface advertises link speed 0: clients rank it last.".into());
        }
    }
    let rss: Vec<bool> = list
        .iter()
        .map(|c| c.interface.capability & NETWORK_INTERFACE_CAP_RSS != 0)
        .collect();
    if rss.contains(&true) && rss.contains(&false) {
        out.push(
            "some interfaces report RSS and some do not: Windows prefers the RSS-capable ones \
             and may leave the others idle."
                .into(),
        );
    }
    for c in list {
        if let Err(e) = &c.bind {
            if f.multichannel {
                out.push(format!(
                    "a channel to the advertised address {} could not be bound ({e}): check \
                     that it is reachable from this host and that the server listens on it.",
                    c.interface.address
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(a: [u8; 4], speed: u64, rss: bool) -> InterfaceCheck {
        InterfaceCheck {
            interface: NetworkInterface {
                if_index: 1,
                capability: if rss { NETWORK_INTERFACE_CAP_RSS } else { 0 },
                link_speed: speed,
                address: a.into(),
            },
            bind: Ok(()),
        }
    }

    fn facts(list: Vec<InterfaceCheck>) -> DoctorFacts {
        DoctorFacts {
            server: "10.0.0.1:445".parse().unwrap(),
            dialect: 0x0311,
            signing: "AesGmac".into(),
            server_requires_signing: false,
            cipher: None,
            encrypted: false,
            multichannel: true,
            max_read: 1 << 23,
            max_write: 1 << 23,
            interfaces: Ok(list),
        }
    }

    #[test]
    fn two_equal_links_need_no_advice() {
        let f = facts(vec![
            nic([10, 0, 0, 1], 1_000_000_000, false),
            nic([10, 0, 1, 1], 1_000_000_000, false),
        ]);
        assert_eq!(advise(&f), Vec::<String>::new());
    }

    #[test]
    fn each_problem_gets_its_advice() {
        let one = advise(&facts(vec![nic([10, 0, 0, 1], 1_000_000_000, false)]));
        assert!(
            one[0].contains("only one interface") && one[0].contains("not RSS"),
            "{one:?}"
        );
        let one_rss = advise(&facts(vec![nic([10, 0, 0, 1], 1_000_000_000, true)]));
        assert!(one_rss[0].contains("RSS-capable"), "{one_rss:?}");
        let mixed = advise(&facts(vec![
            nic([10, 0, 0, 1], 10_000_000_000, true),
            nic([10, 0, 1, 1], 1_000_000_000, false),
        ]));
        assert!(
            mixed
                .iter()
                .any(|a| a.contains("different link speeds") && a.contains("10.0.1.1 (1 Gbit/s)")),
            "{mixed:?}"
        );
        assert!(
            mixed
                .iter()
                .any(|a| a.contains("some interfaces report RSS")),
            "{mixed:?}"
        );
        let mut dead = nic([10, 0, 1, 1], 1_000_000_000, false);
        dead.bind = Err("connect to 10.0.1.1:445: timed out".into());
        let d = advise(&facts(vec![nic([10, 0, 0, 1], 1_000_000_000, false), dead]));
        assert!(
            d.iter().any(|a| a.contains("10.0.1.1 could not be bound")),
            "{d:?}"
        );
        let mut off = facts(vec![nic([10, 0, 0, 1], 1_000_000_000, false)]);
        off.multichannel = false;
        assert!(advise(&off)[0].contains("SMB2_GLOBAL_CAP_MULTI_CHANNEL"));
        let mut none = facts(vec![]);
        none.interfaces = Err("STATUS_NOT_SUPPORTED".into());
        assert!(advise(&none)[0].contains("FSCTL_QUERY_NETWORK_INTERFACE_INFO"));
    }
}
