//! What `lanes doctor` learns about a target, path by path, before judging anything: the pure
//! data the verdicts and the configuration generators work from (so both are testable with
//! synthetic facts, without a target).

use std::net::SocketAddr;
use std::time::Duration;

use lanes_initiator::Error;

/// One target and every portal it was found on.
#[derive(Debug, Clone)]
pub struct TargetFacts {
    pub name: String,
    pub paths: Vec<PathFacts>,
}

/// One portal (one path) of a target.
#[derive(Debug, Clone)]
pub struct PathFacts {
    pub portal: SocketAddr,
    /// Target portal group tag from SendTargets.
    pub tpgt: u16,
    pub outcome: Result<PathInfo, Failure>,
    /// How this host reaches the portal (None when `ip` could not tell).
    pub local: Option<LocalRoute>,
}

impl PathFacts {
    pub fn info(&self) -> Option<&PathInfo> {
        self.outcome.as_ref().ok()
    }
}

/// What went wrong, in words for the operator: one sentence of what happened and one of what
/// to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub what: String,
    pub fix: String,
}

/// What a logged-in path reported.
#[derive(Debug, Clone, PartialEq)]
pub struct PathInfo {
    /// Connect + login time.
    pub login_ms: f64,
    /// NOP-Out round trips.
    pub rtt_ms: Vec<f64>,
    pub negotiated: NegotiatedSummary,
    /// Disk LUNs seen on this path.
    pub luns: Vec<LunFacts>,
    /// REPORT TARGET PORT GROUPS: (group, state), or why it is not available.
    pub alua: Result<Vec<(u16, u8)>, String>,
}

impl PathInfo {
    /// Median round trip (0 when no ping answered).
    pub fn rtt_median_ms(&self) -> f64 {
        let mut v = self.rtt_ms.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }

    pub fn lun(&self, lun: u64) -> Option<&LunFacts> {
        self.luns.iter().find(|l| l.lun == lun)
    }
}

/// The negotiated login keys that matter for throughput (RFC 7143 13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegotiatedSummary {
    /// The target's MaxRecvDataSegmentLength: the largest data segment we may send it.
    pub target_max_recv_data_segment_length: u32,
    /// Ours: the largest data segment the target may send us.
    pub initiator_max_recv_data_segment_length: u32,
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u32,
    pub header_digest: String,
    pub data_digest: String,
}

/// One disk LUN as one path sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LunFacts {
    pub lun: u64,
    /// Device Identification VPD page designator (`naa.…`, `eui.…`, `name.…`, `t10.…`).
    pub id: Option<String>,
    pub blocks: u64,
    pub block_size: u32,
    pub vendor: String,
    pub product: String,
    /// Target port group of the path, from page 0x83.
    pub target_port_group: Option<u16>,
}

/// The local side of a path: the interface traffic leaves through and whether that is an
/// aggregate (bond or multi-nexthop route) whose members are chosen per flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalRoute {
    pub device: String,
    pub mtu: Option<u32>,
    pub aggregate: Option<Aggregate>,
}

/// Several links behind one route, chosen per TCP connection by a hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate {
    /// `bond bond0 (802.3ad)` or `ECMP route`.
    pub kind: String,
    pub members: Vec<String>,
}

/// The linux WWID (`/dev/disk/by-id/wwn-…`, `multipath -ll`) of a designator: SCSI name
/// string designators as udev's scsi_id writes them: type digit + value.
pub fn linux_wwid(id: &str) -> Option<String> {
    if let Some(hex) = id.strip_prefix("naa.") {
        Some(format!("3{hex}"))
    } else if let Some(hex) = id.strip_prefix("eui.") {
        Some(format!("2{hex}"))
    } else if let Some(name) = id.strip_prefix("name.") {
        Some(format!("8{name}"))
    } else {
        // T10 vendor ids: scsi_id squeezes runs of blanks into one underscore.
        id.strip_prefix("t10.").map(|t| {
            let words: Vec<&str> = t.split_whitespace().collect();
            format!("1{}", words.join("_"))
        })
    }
}

/// Words for an initiator error at login: what happened, and what to do.
pub fn login_failure(portal: SocketAddr, error: &Error, timeout: Duration) -> Failure {
    let port = portal.port();
    let not_iscsi = format!(
        "check that {portal} is an iSCSI portal (iSCSI listens on TCP port 3260 by default)"
    );
    let (what, fix) = match error {
        Error::ConnectTimeout { secs, .. } => (
            format!("no answer to TCP connect within {secs} s (unreachable)"),
            format!("check the address, the routing to it and firewalls for TCP port {port}"),
        ),
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::ConnectionRefused => (
            format!("connection refused: nothing listens on port {port}"),
            "check the portal address and port, and that the target service runs".to_string(),
        ),
        Error::Io { source, .. }
            if matches!(
                source.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            (
                format!(
                    "the peer accepted the connection, then reset it during login ({source}): \
                     it does not speak iSCSI"
                ),
                not_iscsi,
            )
        }
        Error::Io { source, .. } => (
            format!("connection failed: {source}"),
            format!("check the address, the routing to it and firewalls for TCP port {port}"),
        ),
        Error::ConnectionLost => (
            "the peer closed the connection during login: it does not speak iSCSI".to_string(),
            not_iscsi,
        ),
        Error::Timeout(_) => (
            format!(
                "no Login Response within {} s: not an iSCSI target, or it hangs",
                timeout.as_secs_f64()
            ),
            not_iscsi,
        ),
        Error::Protocol(m) if m.contains("requires authentication") => (
            "the target requires CHAP authentication".to_string(),
            "pass --chap-user and --chap-secret-file".to_string(),
        ),
        Error::Protocol(m) if m.contains("Digest") => (
            format!("the target insists on digests ({m})"),
            "allow HeaderDigest/DataDigest None on the target: CRC32C digests cost CPU on every \
             PDU and TCP already checksums"
                .to_string(),
        ),
        Error::Protocol(m) => (
            format!("the answer is not an iSCSI Login Response ({m}): it does not speak iSCSI"),
            not_iscsi,
        ),
        Error::LoginRefused {
            class: 2,
            detail: 1,
        } => (
            error.to_string(),
            "check the CHAP user and secret (--chap-user, --chap-secret-file) against the \
             target's"
                .to_string(),
        ),
        Error::LoginRefused {
            class: 2,
            detail: 2,
        } => (
            error.to_string(),
            "add this initiator's name to the target's access list, or pass the name it \
             allows with --initiator-name"
                .to_string(),
        ),
        Error::LoginRefused {
            class: 2,
            detail: 3,
        } => (
            error.to_string(),
            "check the target name (IQN) in the URL".to_string(),
        ),
        other => (
            other.to_string(),
            "see the target's log for why it refused".to_string(),
        ),
    };
    Failure { what, fix }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wwids_follow_udev() {
        assert_eq!(
            linux_wwid("naa.60a6c61aabbccdd").as_deref(),
            Some("360a6c61aabbccdd")
        );
        assert_eq!(linux_wwid("eui.0011").as_deref(), Some("20011"));
        assert_eq!(
            linux_wwid("t10.IET     VIRTUAL-DISK  x").as_deref(),
            Some("1IET_VIRTUAL-DISK_x")
        );
        assert_eq!(linux_wwid("weird"), None);
    }

    #[test]
    fn login_failures_read_as_one_sentence_each() {
        let p: SocketAddr = "127.0.0.1:3260".parse().unwrap();
        let t = Duration::from_secs(10);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let f = login_failure(
            p,
            &Error::Io {
                addr: p,
                source: refused,
            },
            t,
        );
        assert!(f.what.contains("refused"), "{f:?}");
        let f = login_failure(p, &Error::ConnectionLost, t);
        assert!(f.what.contains("does not speak iSCSI"), "{f:?}");
        let f = login_failure(
            p,
            &Error::LoginRefused {
                class: 2,
                detail: 1,
            },
            t,
        );
        assert!(f.what.contains("authentication failed"), "{f:?}");
        assert!(f.fix.contains("--chap-secret-file"), "{f:?}");
        let f = login_failure(p, &Error::Timeout("a Login Response"), t);
        assert!(f.what.contains("10 s"), "{f:?}");
    }
}
