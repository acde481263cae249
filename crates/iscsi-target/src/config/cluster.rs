//! `[cluster]`: two `lanes serve` nodes exporting the same LUNs with synchronous replication
//! (see docs/HA.md). One file serves both nodes: every `[[portal-group]]` names the node it
//! belongs to, and only `[cluster] node` (or `lanes serve --node`) differs.
//!
//! ```toml
//! [cluster]
//! node = 1                         # 1 or 2; `lanes serve --node` overrides it
//! preferred = 1                    # wins epoch races on a tie (default 1)
//! name = "pair"                    # etcd key prefix: /lanes/<name>/lun<N>/epoch
//! etcd = ["10.79.1.1:2379"]        # etcd client endpoints (plain http)
//! listen = "10.78.1.1:7000"        # node 1's replication address; LUN N uses port + N
//! peer = "10.78.1.2:7000"          # node 2's replication address (as seen from node 1)
//! heartbeat = "100ms"              # the peer counts as lost after 3 missed heartbeats
//! activity-log-extents = 1237      # hot 4 MiB extents per LUN (default 1237: 4.8 GiB)
//!
//! [[portal-group]]
//! tag = 1
//! node = 1                         # required with [cluster]
//! portals = ["10.77.1.1:3260"]
//! ```
//!
//! `listen` and `peer` are written from node 1's point of view; node 2 swaps them.

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{cli::parse_portal, PortalGroupConfig, ServeConfig};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawCluster {
    node: Option<Spanned<i64>>,
    preferred: Option<Spanned<i64>>,
    name: Spanned<String>,
    etcd: Spanned<Vec<Spanned<String>>>,
    listen: Spanned<String>,
    peer: Spanned<String>,
    heartbeat: Option<Spanned<String>>,
    activity_log_extents: Option<Spanned<i64>>,
}

/// Activity-log extents (4 MiB each) per replicated LUN by default: 4.8 GiB of a LUN may be
/// written at random without a metadata update per write, as with DRBD's default.
pub const DEFAULT_AL_EXTENTS: usize = 1237;
/// Most activity-log extents (256 GiB hot; compared with the peer after a crash).
pub const MAX_AL_EXTENTS: usize = 65534;

/// The pair this server is one node of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This node, 1 or 2 (0 until chosen by the file or `--node`).
    pub node: u8,
    /// The node that wins epoch races on a tie, 1 or 2.
    pub preferred: u8,
    /// etcd key prefix: `/lanes/<name>/lun<N>/epoch`.
    pub name: String,
    pub etcd: Vec<SocketAddr>,
    /// Node 1's replication address (LUN N listens on port + N).
    pub node1: SocketAddr,
    /// Node 2's replication address.
    pub node2: SocketAddr,
    pub heartbeat: Duration,
    /// Activity-log extents per LUN: random writes spread over more than this many 4 MiB
    /// extents cost a metadata sync each time one enters the log; after a crash this much of
    /// the LUN is compared with the peer (docs/HA.md).
    pub activity_log_extents: usize,
    /// Every portal group of both nodes, with its node.
    pub groups: Vec<(u8, PortalGroupConfig)>,
    /// `lanes serve --replacement`: this node's disks are new (a replaced machine): a LUN
    /// without a metadata journal starts outdated and is copied in full from the peer.
    pub replacement: bool,
}

impl ClusterConfig {
    fn addr(base: SocketAddr, lun: u64) -> SocketAddr {
        let port = u64::from(base.port()) + lun;
        SocketAddr::new(base.ip(), u16::try_from(port).unwrap_or(u16::MAX))
    }

    /// This node's replication listener for `lun`.
    pub fn listen(&self, lun: u64) -> SocketAddr {
        Self::addr(
            if self.node == 1 {
                self.node1
            } else {
                self.node2
            },
            lun,
        )
    }

    /// The peer's replication listener for `lun`.
    pub fn peer(&self, lun: u64) -> SocketAddr {
        Self::addr(
            if self.node == 1 {
                self.node2
            } else {
                self.node1
            },
            lun,
        )
    }

    /// The etcd key of `lun`'s epoch record.
    pub fn epoch_key(&self, lun: u64) -> String {
        format!("/lanes/{}/lun{lun}/epoch", self.name)
    }

    /// The other node's portal groups.
    pub fn peer_groups(&self) -> impl Iterator<Item = &PortalGroupConfig> {
        self.groups
            .iter()
            .filter(move |(n, _)| *n != self.node)
            .map(|(_, g)| g)
    }
}

type Complain<'a> = &'a dyn Fn(Range<usize>, String, String) -> super::ConfigError;

/// Resolve `[cluster]` (the groups are attached by [`attach_groups`]).
pub(super) fn resolve(
    raw: Spanned<RawCluster>,
    complain: Complain<'_>,
) -> Result<ClusterConfig, super::ConfigError> {
    let raw = raw.into_inner();
    let node_of = |v: &Spanned<i64>, key: &str| match *v.get_ref() {
        n @ (1 | 2) => Ok(n as u8),
        n => Err(complain(
            v.span(),
            key.into(),
            format!("must be 1 or 2, got {n}"),
        )),
    };
    let node = raw
        .node
        .as_ref()
        .map(|v| node_of(v, "cluster.node"))
        .transpose()?
        .unwrap_or(0);
    let preferred = raw
        .preferred
        .as_ref()
        .map(|v| node_of(v, "cluster.preferred"))
        .transpose()?
        .unwrap_or(1);
    let name = raw.name.get_ref().clone();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(complain(
            raw.name.span(),
            "cluster.name".into(),
            "must be non-empty letters, digits, '-', '_' or '.'".into(),
        ));
    }
    if raw.etcd.get_ref().is_empty() {
        return Err(complain(
            raw.etcd.span(),
            "cluster.etcd".into(),
            "needs at least one ADDR:PORT".into(),
        ));
    }
    let mut etcd = Vec::new();
    for (i, e) in raw.etcd.get_ref().iter().enumerate() {
        etcd.push(
            parse_portal(e.get_ref(), 2379)
                .map_err(|r| complain(e.span(), format!("cluster.etcd[{i}]"), r))?,
        );
    }
    let addr = |v: &Spanned<String>, key: &str| {
        parse_portal(v.get_ref(), 7000).map_err(|r| complain(v.span(), key.into(), r))
    };
    let node1 = addr(&raw.listen, "cluster.listen")?;
    let node2 = addr(&raw.peer, "cluster.peer")?;
    if node1 == node2 {
        return Err(complain(
            raw.peer.span(),
            "cluster.peer".into(),
            "must differ from cluster.listen".into(),
        ));
    }
    let heartbeat = match &raw.heartbeat {
        None => Duration::from_millis(100),
        Some(h) => super::parse_duration(h.get_ref())
            .ok()
            .filter(|d| (Duration::from_millis(10)..=Duration::from_secs(10)).contains(d))
            .ok_or_else(|| {
                complain(
                    h.span(),
                    "cluster.heartbeat".into(),
                    format!("{:?}: must be a duration from 10ms to 10s", h.get_ref()),
                )
            })?,
    };
    let activity_log_extents = match &raw.activity_log_extents {
        None => DEFAULT_AL_EXTENTS,
        Some(v) => usize::try_from(*v.get_ref())
            .ok()
            .filter(|n| (2..=MAX_AL_EXTENTS).contains(n))
            .ok_or_else(|| {
                complain(
                    v.span(),
                    "cluster.activity-log-extents".into(),
                    format!("must be from 2 to {MAX_AL_EXTENTS}, got {}", v.get_ref()),
                )
            })?,
    };
    Ok(ClusterConfig {
        node,
        preferred,
        name,
        etcd,
        node1,
        node2,
        heartbeat,
        activity_log_extents,
        groups: Vec::new(),
        replacement: false,
    })
}

/// Check every portal group's `node` key against `[cluster]`: required with it, refused
/// without it.
pub(super) fn check_group_node(
    cluster: bool,
    node: Option<&Spanned<i64>>,
    group_span: Range<usize>,
    key: &str,
    complain: Complain<'_>,
) -> Result<u8, super::ConfigError> {
    match (cluster, node) {
        (true, Some(v)) => match *v.get_ref() {
            n @ (1 | 2) => Ok(n as u8),
            n => Err(complain(
                v.span(),
                format!("{key}.node"),
                format!("must be 1 or 2, got {n}"),
            )),
        },
        (true, None) => Err(complain(
            group_span,
            format!("{key}.node"),
            "required with [cluster]: the node (1 or 2) whose portals these are".into(),
        )),
        (false, Some(v)) => Err(complain(
            v.span(),
            format!("{key}.node"),
            "only meaningful with a [cluster] section".into(),
        )),
        (false, None) => Ok(0),
    }
}

/// Make `node` this server's node: its own portal groups become the ones it listens on.
pub fn select_node(config: &mut ServeConfig, node: u8) {
    if let Some(c) = config.cluster.as_mut() {
        c.node = node;
        config.portal_groups = c
            .groups
            .iter()
            .filter(|(n, _)| *n == node)
            .map(|(_, g)| g.clone())
            .collect();
    }
}
