//! The command line of `lanes attach`.

use clap::Args;
use mpath::{Failback, Policy};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// A duration written as `250ms`, `2s`, `1.5s` or `1m`.
#[derive(Debug, Clone, Copy)]
pub struct Span(pub Duration);

impl FromStr for Span {
    type Err = String;
    fn from_str(s: &str) -> Result<Span, String> {
        let bad = || format!("'{s}' is not a duration (like 250ms, 2s, 1m)");
        let (number, unit) = s
            .find(|c: char| c.is_ascii_alphabetic())
            .map(|i| s.split_at(i))
            .ok_or_else(bad)?;
        let n: f64 = number.trim().parse().map_err(|_| bad())?;
        let secs = match unit {
            "ms" => n / 1000.0,
            "s" => n,
            "m" | "min" => n * 60.0,
            _ => return Err(bad()),
        };
        if !(0.0..=86_400.0).contains(&secs) {
            return Err(bad());
        }
        Ok(Span(Duration::from_secs_f64(secs)))
    }
}

/// `ADDR:PORT=IFACE` for --bind.
#[derive(Debug, Clone)]
pub struct PortalInterface {
    pub portal: SocketAddr,
    pub interface: String,
}

impl FromStr for PortalInterface {
    type Err = String;
    fn from_str(s: &str) -> Result<PortalInterface, String> {
        let (p, i) = s
            .rsplit_once('=')
            .ok_or_else(|| format!("'{s}': expected ADDR:PORT=INTERFACE"))?;
        // Linux interface names: 1 to 15 bytes, no '/', no whitespace.
        if i.is_empty() || i.len() > 15 || i.contains('/') || i.contains(char::is_whitespace) {
            return Err(format!("'{i}' is not an interface name"));
        }
        Ok(PortalInterface {
            portal: p.parse().map_err(|_| format!("'{p}' is not ADDR:PORT"))?,
            interface: i.to_string(),
        })
    }
}

/// `ADDR:PORT=N` for --weight and --priority.
#[derive(Debug, Clone)]
pub struct PortalValue {
    pub portal: SocketAddr,
    pub value: u32,
}

impl FromStr for PortalValue {
    type Err = String;
    fn from_str(s: &str) -> Result<PortalValue, String> {
        let (p, v) = s
            .rsplit_once('=')
            .ok_or_else(|| format!("'{s}': expected ADDR:PORT=N"))?;
        Ok(PortalValue {
            portal: p.parse().map_err(|_| format!("'{p}' is not ADDR:PORT"))?,
            value: v.parse().map_err(|_| format!("'{v}' is not a number"))?,
        })
    }
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The LUN: iscsi://[user%secret@]PORTAL[:PORT]/IQN/LUN. Every portal SendTargets reports
    /// for the target becomes a path.
    pub url: String,
    /// More portals to use as paths (ADDR[:PORT], repeatable).
    #[arg(long = "portal", value_name = "ADDR:PORT")]
    pub portals: Vec<String>,
    /// Path selection: service-time, queue-length, round-robin, round-robin-subset,
    /// weighted or failover.
    #[arg(long, default_value = "service-time")]
    pub policy: Policy,
    /// Failback of the failover policy: immediate, manual or a delay in seconds.
    #[arg(long, default_value = "immediate")]
    pub failback: Failback,
    /// Weight of one portal for the weighted policy (ADDR:PORT=N, repeatable; default 1).
    #[arg(long = "weight", value_name = "ADDR:PORT=N")]
    pub weights: Vec<PortalValue>,
    /// Priority of one portal for the failover policy (ADDR:PORT=N, higher first; default 0).
    #[arg(long = "priority", value_name = "ADDR:PORT=N")]
    pub priorities: Vec<PortalValue>,
    /// One session with one connection per portal (MC/S) instead of one session per portal.
    #[arg(long)]
    pub mcs: bool,
    /// Send one portal's path out through a given local interface (ADDR:PORT=IFACE,
    /// repeatable): in a mesh, where every NIC is on one subnet, each path gets its own NIC.
    #[arg(long = "bind", value_name = "ADDR:PORT=IFACE")]
    pub binds: Vec<PortalInterface>,
    /// Export the device over NBD: unix:PATH or a loopback ADDR:PORT.
    #[arg(long, value_name = "unix:PATH|ADDR:PORT")]
    pub nbd: Option<lanes_export::NbdListen>,
    /// Export the device as the file DIR/disk (FUSE).
    #[arg(long, value_name = "DIR")]
    pub fuse: Option<PathBuf>,
    /// CHAP user name (one-way CHAP).
    #[arg(long)]
    pub chap_user: Option<String>,
    /// File holding the CHAP secret (one line).
    #[arg(long, value_name = "FILE")]
    pub chap_secret_file: Option<PathBuf>,
    /// Initiator name [default: iqn.2026-01.io.lanes:<hostname>].
    #[arg(long)]
    pub initiator_name: Option<String>,
    /// With every path down, how long I/O waits before failing.
    #[arg(long, default_value = "30s")]
    pub no_path_timeout: Span,
    /// NOP-Out ping interval per path (3 unanswered pings fail the path).
    #[arg(long, default_value = "250ms")]
    pub ping_interval: Span,
    /// Requests larger than this many bytes are split across the paths.
    #[arg(long, default_value_t = 128 << 10)]
    pub split_threshold: u32,
    /// Status socket [default: /run/lanes/attach-<LUN id>.sock].
    #[arg(long, value_name = "PATH")]
    pub status_socket: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (GET /metrics).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
}

impl AttachArgs {
    pub fn initiator_name(&self) -> String {
        self.initiator_name.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "host".into());
            let host: String = host
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect();
            format!("iqn.2026-01.io.lanes:{host}")
        })
    }

    pub fn weight_of(&self, portal: SocketAddr) -> u32 {
        self.weights
            .iter()
            .find(|w| w.portal == portal)
            .map_or(1, |w| w.value.max(1))
    }

    pub fn priority_of(&self, portal: SocketAddr) -> u32 {
        self.priorities
            .iter()
            .find(|w| w.portal == portal)
            .map_or(0, |w| w.value)
    }

    pub fn interface_of(&self, portal: SocketAddr) -> Option<String> {
        self.binds
            .iter()
            .find(|b| b.portal == portal)
            .map(|b| b.interface.clone())
    }

    pub fn status_socket_path(&self, lun_id: &str) -> PathBuf {
        self.status_socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("/run/lanes/attach-{lun_id}.sock")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_portal_values_parse() {
        assert_eq!(
            "250ms".parse::<Span>().unwrap().0,
            Duration::from_millis(250)
        );
        assert_eq!(
            "1.5s".parse::<Span>().unwrap().0,
            Duration::from_millis(1500)
        );
        assert_eq!("2m".parse::<Span>().unwrap().0, Duration::from_secs(120));
        assert!("250".parse::<Span>().is_err());
        assert!("-1s".parse::<Span>().is_err());
        assert!("5parsecs".parse::<Span>().is_err());
        let w: PortalValue = "10.0.0.1:3260=4".parse().unwrap();
        assert_eq!((w.portal.port(), w.value), (3260, 4));
        assert!("10.0.0.1=4".parse::<PortalValue>().is_err());
        assert!("10.0.0.1:3260=x".parse::<PortalValue>().is_err());
        let b: PortalInterface = "10.0.0.1:3260=eth1".parse().unwrap();
        assert_eq!(b.interface, "eth1");
        assert!("10.0.0.1:3260=".parse::<PortalInterface>().is_err());
        assert!("10.0.0.1:3260=a-very-long-interface"
            .parse::<PortalInterface>()
            .is_err());
    }
}
