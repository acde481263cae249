//! The TOML configuration file: schema, parsing, and resolution into [`ServeConfig`].
//!
//! Keys are kebab-case and unknown keys are errors. Relative paths inside the file are relative
//! to the file's directory. Every key is optional unless marked *required*.
//!
//! ```toml
//! [server]
//! nop-interval = "5s"            # idle time before a NOP-In ping; "0s" disables pings
//! nop-timeout = "15s"            # unanswered ping this long = connection dropped
//! metrics = "127.0.0.1:9260"     # Prometheus /metrics listener; off when absent
//! data-dir = "lanes-data"        # default: ./lanes-data (relative to the working directory)
//! status-socket = "/run/lanes.sock"  # default: <data-dir>/lanes.sock
//!
//! [discovery-auth]               # CHAP for SendTargets discovery sessions
//! user = "discovery"
//! secret = "at least 12 bytes"   # or secret-file = "path"; 0x... hex, 0b... base64
//!
//! [[portal-group]]               # default when absent: tag 1 on 0.0.0.0:3260
//! tag = 1                        # required; TPGT and ALUA target port group id, 1..=65535
//! name = "lan-a"                 # default: "tpg<tag>"
//! portals = ["192.0.2.10:3260", "[2001:db8::10]:3260"]   # required; port defaults to 3260
//! alua = "active-optimized"      # active-non-optimized | standby | unavailable | transitioning
//!
//! [[target]]
//! name = "iqn.2026-11.io.lanes:store"    # iqn./eui./naa. name; default (one target only):
//!                                        # iqn.2026-11.io.lanes:<hostname>, as without a file
//! alias = "store"
//! portal-groups = [1, 2]         # default: every portal group
//! acl = ["iqn.2005-03.org.open-iscsi:host1", "10.0.0.0/24", "fd00::/64"]  # default: everyone
//! allow-multiple-sessions = true
//! max-connections = 32           # MaxConnections per session (MC/S)
//! header-digest = "None,CRC32C"  # offered values, preferred first
//! data-digest = "None,CRC32C"
//! first-burst-length = "64K"     # RFC 7143 defaults: 64K, 256K, 8K, Yes, Yes, 1
//! max-burst-length = "256K"
//! max-recv-data-segment-length = "8K"
//! immediate-data = true
//! initial-r2t = true
//! max-outstanding-r2t = 1
//!
//! [target.chap]                  # initiators must authenticate with CHAP
//! user = "host1"
//! secret-file = "host1.secret"
//! mutual-user = "lanes"          # mutual CHAP: the target proves itself too
//! mutual-secret = "0x00112233445566778899aabbccddeeff"
//! algorithms = ["sha3-256", "sha256", "sha1", "md5"]   # default: all, strongest first
//!
//! [[target.lun]]
//! lun = 0                        # default: previous LUN + 1, starting at 0
//! path = "disk0.img"             # required; file (created sparse when `size` is set) or device
//! size = "10G"                   # default: size of the existing file; powers of 1024
//! block-size = 512               # 512 or 4096
//! serial = "disk0"               # default: stable hash of target name and LUN number
//! read-only = false
//! write-cache = true
//! volatile-cache = false         # test harness only: writes live in process memory until a
//!                                # flush, so kill -9 loses what a power loss would
//!
//! [[target.lun]]                 # a LUN on a Ceph RBD image (instead of `path`)
//! backend = "rbd"
//! pool = "rbd"
//! image = "vol1"                 # created with `rbd create --image-feature layering`
//! ceph-conf = "/etc/ceph/ceph.conf"   # default
//! ceph-client = "admin"          # default; its keyring as ceph.conf says
//! watch-timeout = 5              # default, seconds (2 to 60): a gateway silent this long
//!                                # (killed, paused, cut off) is fenced by the others
//!
//! [limits]                       # see `config::limits` for every key and its default
//! login-timeout = "15s"
//! ```

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::error::Location;
use super::{
    cli::parse_portal, offered_defaults, AclRule, AluaStateConfig, ChapAlgorithm, ChapConfig,
    ConfigError, DigestConfig, LunConfig, PortalGroupConfig, Secret, ServeConfig, TargetConfig,
    DEFAULT_DATA_DIR, DEFAULT_ISCSI_PORT, DEFAULT_NOP_INTERVAL, DEFAULT_NOP_TIMEOUT, MAX_LUN,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawFile {
    server: Option<RawServer>,
    discovery_auth: Option<Spanned<RawChap>>,
    #[serde(default)]
    portal_group: Vec<Spanned<RawPortalGroup>>,
    #[serde(default)]
    target: Vec<Spanned<RawTarget>>,
    limits: Option<super::limits::RawLimits>,
    cluster: Option<Spanned<super::cluster::RawCluster>>,
    /// `[smb]` and `[[share]]` belong to the SMB server (crate lanes-smb-server), which reads
    /// the same file; they are skipped here.
    #[allow(dead_code)]
    smb: Option<serde::de::IgnoredAny>,
    #[allow(dead_code)]
    share: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawServer {
    nop_interval: Option<Spanned<NumberOrText>>,
    nop_timeout: Option<Spanned<NumberOrText>>,
    metrics: Option<Spanned<String>>,
    data_dir: Option<Spanned<String>>,
    status_socket: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawPortalGroup {
    tag: Spanned<i64>,
    name: Option<Spanned<String>>,
    portals: Spanned<Vec<Spanned<String>>>,
    alua: Option<Spanned<String>>,
    node: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawTarget {
    name: Option<Spanned<String>>,
    alias: Option<String>,
    portal_groups: Option<Spanned<Vec<Spanned<i64>>>>,
    #[serde(default)]
    acl: Vec<Spanned<String>>,
    chap: Option<Spanned<RawChap>>,
    allow_multiple_sessions: Option<bool>,
    max_connections: Option<Spanned<i64>>,
    header_digest: Option<Spanned<String>>,
    data_digest: Option<Spanned<String>>,
    first_burst_length: Option<Spanned<NumberOrText>>,
    max_burst_length: Option<Spanned<NumberOrText>>,
    max_recv_data_segment_length: Option<Spanned<NumberOrText>>,
    immediate_data: Option<bool>,
    initial_r2t: Option<bool>,
    max_outstanding_r2t: Option<Spanned<i64>>,
    #[serde(default)]
    lun: Vec<Spanned<RawLun>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawLun {
    lun: Option<Spanned<i64>>,
    path: Option<Spanned<String>>,
    backend: Option<Spanned<String>>,
    pool: Option<Spanned<String>>,
    image: Option<Spanned<String>>,
    ceph_conf: Option<Spanned<String>>,
    ceph_client: Option<Spanned<String>>,
    watch_timeout: Option<Spanned<i64>>,
    size: Option<Spanned<NumberOrText>>,
    block_size: Option<Spanned<i64>>,
    serial: Option<Spanned<String>>,
    read_only: Option<bool>,
    write_cache: Option<bool>,
    volatile_cache: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawChap {
    user: Spanned<String>,
    secret: Option<Spanned<String>>,
    secret_file: Option<Spanned<String>>,
    mutual_user: Option<Spanned<String>>,
    mutual_secret: Option<Spanned<String>>,
    mutual_secret_file: Option<Spanned<String>>,
    algorithms: Option<Spanned<Vec<Spanned<String>>>>,
}

/// A size or duration written either as a bare number or as text with a unit.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(i64),
    Text(String),
}

/// Parses and validates a whole configuration file (see the module docs for the schema).
pub(crate) fn parse(text: &str, file: &Path) -> Result<ServeConfig, ConfigError> {
    let config = parse_partial(text, file)?;
    super::cli::check_complete(&config, Some(file))?;
    Ok(config)
}

/// Parses and validates a file that may still lack targets or LUNs (the command line may add
/// them).
pub(crate) fn parse_partial(text: &str, file: &Path) -> Result<ServeConfig, ConfigError> {
    let raw: RawFile = toml::from_str(text).map_err(|err| {
        let offset = err.span().map_or(0, |span| span.start);
        let location = Location::at(file.to_path_buf(), text, offset);
        let message = err.message().trim().to_string();
        match key_path_at(text, offset) {
            Some(key) => ConfigError::Invalid {
                location,
                key,
                message,
            },
            None => ConfigError::Syntax { location, message },
        }
    })?;
    Resolver {
        file,
        text,
        base: file.parent().unwrap_or(Path::new("")),
    }
    .resolve(raw)
}

struct Resolver<'a> {
    file: &'a Path,
    text: &'a str,
    base: &'a Path,
}

impl Resolver<'_> {
    fn error(
        &self,
        span: Range<usize>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            location: Location::at(self.file.to_path_buf(), self.text, span.start),
            key: key.into(),
            message: message.into(),
        }
    }

    fn path(&self, text: &str) -> PathBuf {
        normalize(&self.base.join(text))
    }

    fn resolve(&self, raw: RawFile) -> Result<ServeConfig, ConfigError> {
        let mut config = ServeConfig {
            targets: Vec::new(),
            portal_groups: Vec::new(),
            discovery_auth: None,
            metrics_addr: None,
            status_socket: None,
            nop_interval: DEFAULT_NOP_INTERVAL,
            nop_timeout: DEFAULT_NOP_TIMEOUT,
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            limits: Default::default(),
            cluster: None,
        };
        if let Some(cluster) = raw.cluster {
            let span = cluster.span();
            if raw.portal_group.is_empty() {
                return Err(self.error(
                    span,
                    "portal-group",
                    "[cluster] needs the [[portal-group]]s of both nodes, each with its node",
                ));
            }
            config.cluster = Some(super::cluster::resolve(cluster, &|span, key, message| {
                self.error(span, key, message)
            })?);
        }
        if let Some(limits) = raw.limits {
            config.limits = super::limits::resolve(limits, &|span, key, message| {
                self.error(span, key, message)
            })?;
        }
        if let Some(server) = raw.server {
            self.resolve_server(server, &mut config)?;
        }
        if let Some(auth) = raw.discovery_auth {
            config.discovery_auth = Some(self.resolve_chap(auth, "discovery-auth")?);
        }
        let (groups, nodes) =
            self.resolve_portal_groups(raw.portal_group, config.cluster.is_some())?;
        config.portal_groups = groups;
        if let Some(cluster) = config.cluster.as_mut() {
            cluster.groups = nodes
                .into_iter()
                .zip(config.portal_groups.clone())
                .collect();
        }
        let mut names = HashSet::new();
        for (index, target) in raw.target.into_iter().enumerate() {
            let key = format!("target[{index}]");
            let span = target
                .get_ref()
                .name
                .as_ref()
                .map_or(target.span(), Spanned::span);
            let target =
                self.resolve_target(target.into_inner(), &key, &config.portal_groups, &span)?;
            if !names.insert(target.name.clone()) {
                return Err(self.error(
                    span,
                    format!("{key}.name"),
                    format!("duplicate target name {:?}", target.name),
                ));
            }
            config.targets.push(target);
        }
        if let Some(node) = config.cluster.as_ref().map(|c| c.node).filter(|&n| n != 0) {
            super::cluster::select_node(&mut config, node);
        }
        Ok(config)
    }

    fn resolve_server(
        &self,
        server: RawServer,
        config: &mut ServeConfig,
    ) -> Result<(), ConfigError> {
        if let Some(value) = server.nop_interval {
            config.nop_interval = self.duration(&value, "server.nop-interval")?;
        }
        if let Some(value) = server.nop_timeout {
            config.nop_timeout = self.duration(&value, "server.nop-timeout")?;
            if config.nop_timeout.is_zero() {
                return Err(self.error(
                    value.span(),
                    "server.nop-timeout",
                    "must be greater than zero",
                ));
            }
        }
        if let Some(metrics) = server.metrics {
            let addr = parse_portal(metrics.get_ref(), 9260)
                .map_err(|reason| self.error(metrics.span(), "server.metrics", reason))?;
            config.metrics_addr = Some(addr);
        }
        if let Some(dir) = server.data_dir {
            config.data_dir = self.path(dir.get_ref());
        }
        if let Some(socket) = server.status_socket {
            config.status_socket = Some(self.path(socket.get_ref()));
        }
        Ok(())
    }

    fn duration(
        &self,
        value: &Spanned<NumberOrText>,
        key: &str,
    ) -> Result<std::time::Duration, ConfigError> {
        match value.get_ref() {
            NumberOrText::Number(secs) => u64::try_from(*secs)
                .map(std::time::Duration::from_secs)
                .map_err(|_| self.error(value.span(), key, "must not be negative")),
            NumberOrText::Text(text) => {
                super::parse_duration(text).map_err(|reason| self.error(value.span(), key, reason))
            }
        }
    }

    fn size(&self, value: &Spanned<NumberOrText>, key: &str) -> Result<u64, ConfigError> {
        match value.get_ref() {
            NumberOrText::Number(bytes) => u64::try_from(*bytes)
                .map_err(|_| self.error(value.span(), key, "must not be negative")),
            NumberOrText::Text(text) => {
                super::parse_size(text).map_err(|reason| self.error(value.span(), key, reason))
            }
        }
    }

    fn length_key(
        &self,
        value: &Option<Spanned<NumberOrText>>,
        key: &str,
        default: u32,
    ) -> Result<u32, ConfigError> {
        let Some(value) = value else {
            return Ok(default);
        };
        let bytes = self.size(value, key)?;
        let range = offered_defaults::LENGTH_RANGE;
        u32::try_from(bytes)
            .ok()
            .filter(|b| range.contains(b))
            .ok_or_else(|| {
                self.error(
                    value.span(),
                    key,
                    format!(
                        "must be {}..={} bytes (RFC 7143 13), got {bytes}",
                        range.start(),
                        range.end()
                    ),
                )
            })
    }

    fn integer<T: TryFrom<i64>>(
        &self,
        value: &Spanned<i64>,
        key: &str,
        range: Range<i64>,
        what: &str,
    ) -> Result<T, ConfigError> {
        let n = *value.get_ref();
        if !range.contains(&n) {
            return Err(self.error(value.span(), key, format!("must be {what}, got {n}")));
        }
        T::try_from(n)
            .map_err(|_| self.error(value.span(), key, format!("must be {what}, got {n}")))
    }

    /// The portal groups, and the node of each (0 without `[cluster]`).
    fn resolve_portal_groups(
        &self,
        raw: Vec<Spanned<RawPortalGroup>>,
        cluster: bool,
    ) -> Result<(Vec<PortalGroupConfig>, Vec<u8>), ConfigError> {
        if raw.is_empty() {
            return Ok((
                vec![default_portal_group(vec![SocketAddr::from((
                    [0, 0, 0, 0],
                    DEFAULT_ISCSI_PORT,
                ))])],
                vec![0],
            ));
        }
        let mut groups: Vec<PortalGroupConfig> = Vec::new();
        let mut nodes = Vec::new();
        let mut seen_portals: HashMap<SocketAddr, String> = HashMap::new();
        for (index, group) in raw.into_iter().enumerate() {
            let key = format!("portal-group[{index}]");
            let group_span = group.span();
            let group = group.into_inner();
            nodes.push(super::cluster::check_group_node(
                cluster,
                group.node.as_ref(),
                group_span,
                &key,
                &|span, key, message| self.error(span, key, message),
            )?);
            let tag: u16 =
                self.integer(&group.tag, &format!("{key}.tag"), 1..65536, "1..=65535")?;
            if groups.iter().any(|g| g.tag == tag) {
                return Err(self.error(
                    group.tag.span(),
                    format!("{key}.tag"),
                    format!("duplicate portal-group tag {tag}"),
                ));
            }
            let name = match &group.name {
                Some(name) if name.get_ref().trim().is_empty() => {
                    return Err(self.error(name.span(), format!("{key}.name"), "must not be empty"))
                }
                Some(name) => name.get_ref().clone(),
                None => format!("tpg{tag}"),
            };
            if let (Some(span), true) = (
                group.name.as_ref().map(Spanned::span),
                groups.iter().any(|g| g.name == name),
            ) {
                return Err(self.error(
                    span,
                    format!("{key}.name"),
                    format!("duplicate portal-group name {name:?}"),
                ));
            }
            if group.portals.get_ref().is_empty() {
                return Err(self.error(
                    group.portals.span(),
                    format!("{key}.portals"),
                    "needs at least one ADDR:PORT",
                ));
            }
            let mut portals = Vec::new();
            for (i, portal) in group.portals.get_ref().iter().enumerate() {
                let portal_key = format!("{key}.portals[{i}]");
                let addr = parse_portal(portal.get_ref(), DEFAULT_ISCSI_PORT)
                    .map_err(|reason| self.error(portal.span(), &portal_key, reason))?;
                if let Some(previous) = seen_portals.insert(addr, portal_key.clone()) {
                    return Err(self.error(
                        portal.span(),
                        portal_key,
                        format!("portal {addr} is already listed at {previous}"),
                    ));
                }
                portals.push(addr);
            }
            let alua_state = match &group.alua {
                None => AluaStateConfig::default(),
                Some(state) => AluaStateConfig::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(state.get_ref()))
                    .map_err(|_| self.error(state.span(), format!("{key}.alua"), format!(
                        "{:?} is not an ALUA state (active-optimized, active-non-optimized, standby, unavailable, transitioning)",
                        state.get_ref()
                    )))?,
            };
            groups.push(PortalGroupConfig {
                tag,
                name,
                portals,
                alua_state,
            });
        }
        Ok((groups, nodes))
    }

    fn resolve_target(
        &self,
        raw: RawTarget,
        key: &str,
        groups: &[PortalGroupConfig],
        name_span: &Range<usize>,
    ) -> Result<TargetConfig, ConfigError> {
        // Without a name, the host's: a packaged file can then serve on many hosts without two
        // of them reporting the same LUN identifiers.
        let name = raw
            .name
            .as_ref()
            .map_or_else(super::cli::default_target_name, |n| n.get_ref().clone());
        super::validate_iscsi_name(&name)
            .map_err(|reason| self.error(name_span.clone(), format!("{key}.name"), reason))?;
        let mut target = TargetConfig::with_defaults(name, groups.iter().map(|g| g.tag).collect());
        target.alias = raw.alias;
        if let Some(tags) = &raw.portal_groups {
            if !tags.get_ref().is_empty() {
                target.portal_groups.clear();
            }
            for (i, tag) in tags.get_ref().iter().enumerate() {
                let tag_key = format!("{key}.portal-groups[{i}]");
                let known = groups
                    .iter()
                    .map(|g| g.tag.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                let value = u16::try_from(*tag.get_ref())
                    .ok()
                    .filter(|t| groups.iter().any(|g| g.tag == *t));
                let Some(value) = value else {
                    return Err(self.error(
                        tag.span(),
                        tag_key,
                        format!(
                            "unknown portal-group tag {} (defined: {known})",
                            tag.get_ref()
                        ),
                    ));
                };
                if !target.portal_groups.contains(&value) {
                    target.portal_groups.push(value);
                }
            }
        }
        for (i, rule) in raw.acl.iter().enumerate() {
            let rule_value = rule
                .get_ref()
                .parse::<AclRule>()
                .map_err(|reason| self.error(rule.span(), format!("{key}.acl[{i}]"), reason))?;
            target.acl.push(rule_value);
        }
        if let Some(chap) = raw.chap {
            target.chap = Some(self.resolve_chap(chap, &format!("{key}.chap"))?);
        }
        if let Some(allow) = raw.allow_multiple_sessions {
            target.allow_multiple_sessions = allow;
        }
        if let Some(value) = &raw.max_connections {
            target.max_connections = self.integer(
                value,
                &format!("{key}.max-connections"),
                1..65536,
                "1..=65535",
            )?;
        }
        if let Some(value) = &raw.header_digest {
            target.header_digest = self.digests(value, &format!("{key}.header-digest"))?;
        }
        if let Some(value) = &raw.data_digest {
            target.data_digest = self.digests(value, &format!("{key}.data-digest"))?;
        }
        target.first_burst_length = self.length_key(
            &raw.first_burst_length,
            &format!("{key}.first-burst-length"),
            target.first_burst_length,
        )?;
        target.max_burst_length = self.length_key(
            &raw.max_burst_length,
            &format!("{key}.max-burst-length"),
            target.max_burst_length,
        )?;
        target.max_recv_data_segment_length = self.length_key(
            &raw.max_recv_data_segment_length,
            &format!("{key}.max-recv-data-segment-length"),
            target.max_recv_data_segment_length,
        )?;
        if target.first_burst_length > target.max_burst_length {
            // RFC 7143 13.14: FirstBurstLength MUST NOT exceed MaxBurstLength.
            let span = raw
                .first_burst_length
                .as_ref()
                .or(raw.max_burst_length.as_ref())
                .map_or(name_span.clone(), Spanned::span);
            return Err(self.error(
                span,
                format!("{key}.first-burst-length"),
                format!(
                    "{} exceeds max-burst-length {} (RFC 7143 13.14)",
                    target.first_burst_length, target.max_burst_length
                ),
            ));
        }
        if let Some(value) = raw.immediate_data {
            target.immediate_data = value;
        }
        if let Some(value) = raw.initial_r2t {
            target.initial_r2t = value;
        }
        if let Some(value) = &raw.max_outstanding_r2t {
            target.max_outstanding_r2t = self.integer(
                value,
                &format!("{key}.max-outstanding-r2t"),
                1..65536,
                "1..=65535",
            )?;
        }
        let mut next_lun = 0u64;
        for (i, lun) in raw.lun.into_iter().enumerate() {
            let lun_key = format!("{key}.lun[{i}]");
            let lun = self.resolve_lun(lun.into_inner(), &lun_key, &target, next_lun)?;
            next_lun = lun.lun + 1;
            target.luns.push(lun);
        }
        Ok(target)
    }

    fn resolve_lun(
        &self,
        raw: RawLun,
        key: &str,
        target: &TargetConfig,
        default_number: u64,
    ) -> Result<LunConfig, ConfigError> {
        let number = match &raw.lun {
            Some(value) => self.integer(
                value,
                &format!("{key}.lun"),
                0..MAX_LUN as i64 + 1,
                &format!("0..={MAX_LUN}"),
            )?,
            None => default_number,
        };
        let lun_span = raw
            .lun
            .as_ref()
            .map(Spanned::span)
            .or_else(|| raw.path.as_ref().map(Spanned::span))
            .or_else(|| raw.backend.as_ref().map(Spanned::span))
            .unwrap_or(0..0);
        if let Some(other) = target.luns.iter().position(|l| l.lun == number) {
            let span = lun_span.clone();
            return Err(self.error(
                span,
                format!("{key}.lun"),
                format!("duplicate LUN {number} (also lun[{other}])"),
            ));
        }
        if number > MAX_LUN {
            return Err(self.error(
                lun_span,
                format!("{key}.lun"),
                format!("LUN {number} is beyond {MAX_LUN}"),
            ));
        }
        let mut lun = match (&raw.backend, &raw.path) {
            (Some(backend), _) if backend.get_ref() == "rbd" => {
                if let Some(path) = &raw.path {
                    return Err(self.error(
                        path.span(),
                        format!("{key}.path"),
                        "an RBD LUN has pool and image, not a path",
                    ));
                }
                let text =
                    |v: &Option<Spanned<String>>, name: &str| -> Result<String, ConfigError> {
                        match v {
                            Some(v) if !v.get_ref().is_empty() && !v.get_ref().contains('/') => {
                                Ok(v.get_ref().clone())
                            }
                            Some(v) => Err(self.error(
                                v.span(),
                                format!("{key}.{name}"),
                                "must be a non-empty name without '/'",
                            )),
                            None => Err(self.error(
                                backend.span(),
                                format!("{key}.{name}"),
                                "required with backend = \"rbd\"",
                            )),
                        }
                    };
                let source = lanes_rbd::RbdSource {
                    pool: text(&raw.pool, "pool")?,
                    image: text(&raw.image, "image")?,
                    ceph_conf: raw
                        .ceph_conf
                        .as_ref()
                        .map_or_else(|| "/etc/ceph/ceph.conf".into(), |c| self.path(c.get_ref())),
                    client: raw
                        .ceph_client
                        .as_ref()
                        .map_or_else(|| "admin".to_string(), |c| c.get_ref().clone()),
                    watch_timeout_s: match &raw.watch_timeout {
                        None => lanes_rbd::DEFAULT_WATCH_TIMEOUT_S,
                        Some(v) => lanes_rbd::parse_watch_timeout(&v.get_ref().to_string())
                            .map_err(|why| {
                                self.error(v.span(), format!("{key}.watch-timeout"), why)
                            })?,
                    },
                };
                let mut lun = LunConfig::new(number, format!("rbd:{}", source.spec()).into());
                lun.rbd = Some(source);
                lun
            }
            (Some(backend), _) if backend.get_ref() != "file" => {
                return Err(self.error(
                    backend.span(),
                    format!("{key}.backend"),
                    format!("must be \"file\" or \"rbd\", got {:?}", backend.get_ref()),
                ))
            }
            (_, Some(path)) if !path.get_ref().is_empty() => {
                LunConfig::new(number, self.path(path.get_ref()))
            }
            (_, Some(path)) => {
                return Err(self.error(path.span(), format!("{key}.path"), "must not be empty"))
            }
            (_, None) => {
                return Err(self.error(
                    lun_span,
                    format!("{key}.path"),
                    "required (or backend = \"rbd\" with pool and image)",
                ))
            }
        };
        for (value, name) in [
            (&raw.pool, "pool"),
            (&raw.image, "image"),
            (&raw.ceph_conf, "ceph-conf"),
            (&raw.ceph_client, "ceph-client"),
        ] {
            if let (Some(v), None) = (value, &lun.rbd) {
                return Err(self.error(
                    v.span(),
                    format!("{key}.{name}"),
                    "only for backend = \"rbd\"",
                ));
            }
        }
        if let (Some(v), None) = (&raw.watch_timeout, &lun.rbd) {
            return Err(self.error(
                v.span(),
                format!("{key}.watch-timeout"),
                "only for backend = \"rbd\"",
            ));
        }
        if let Some(value) = &raw.block_size {
            lun.block_size = match value.get_ref() {
                512 => 512,
                4096 => 4096,
                other => {
                    return Err(self.error(
                        value.span(),
                        format!("{key}.block-size"),
                        format!("must be 512 or 4096, got {other}"),
                    ))
                }
            };
        }
        if let (Some(value), Some(_)) = (&raw.size, &lun.rbd) {
            return Err(self.error(
                value.span(),
                format!("{key}.size"),
                "an RBD image has its own size (change it with `rbd resize`)",
            ));
        }
        if let Some(value) = &raw.size {
            let size = self.size(value, &format!("{key}.size"))?;
            check_size(size, lun.block_size)
                .map_err(|reason| self.error(value.span(), format!("{key}.size"), reason))?;
            lun.size = Some(size);
        }
        if let Some(value) = &raw.serial {
            check_serial(value.get_ref())
                .map_err(|reason| self.error(value.span(), format!("{key}.serial"), reason))?;
            lun.serial = Some(value.get_ref().clone());
        } else {
            lun.serial = Some(super::default_serial(&target.name, number));
        }
        if let Some(value) = raw.read_only {
            lun.read_only = value;
        }
        if let Some(value) = raw.write_cache {
            lun.write_cache = value;
        }
        if let Some(value) = raw.volatile_cache {
            lun.volatile_cache = value;
        }
        Ok(lun)
    }

    fn digests(
        &self,
        value: &Spanned<String>,
        key: &str,
    ) -> Result<Vec<DigestConfig>, ConfigError> {
        parse_digests(value.get_ref()).map_err(|reason| self.error(value.span(), key, reason))
    }

    fn secret(
        &self,
        inline: &Option<Spanned<String>>,
        file: &Option<Spanned<String>>,
        key: &str,
        file_key: &str,
    ) -> Result<Option<Secret>, ConfigError> {
        match (inline, file) {
            (Some(_), Some(file)) => Err(self.error(
                file.span(),
                file_key,
                format!("give either {key} or {file_key}, not both"),
            )),
            (Some(inline), None) => Secret::decode(inline.get_ref())
                .map(Some)
                .map_err(|reason| self.error(inline.span(), key, reason)),
            (None, Some(file)) => {
                let path = self.path(file.get_ref());
                let text = std::fs::read_to_string(&path).map_err(|err| {
                    self.error(
                        file.span(),
                        file_key,
                        format!("cannot read {}: {err}", path.display()),
                    )
                })?;
                let text = text.strip_suffix('\n').unwrap_or(&text);
                let text = text.strip_suffix('\r').unwrap_or(text);
                Secret::decode(text).map(Some).map_err(|reason| {
                    self.error(
                        file.span(),
                        file_key,
                        format!("{}: {reason}", path.display()),
                    )
                })
            }
            (None, None) => Ok(None),
        }
    }

    fn resolve_chap(&self, raw: Spanned<RawChap>, key: &str) -> Result<ChapConfig, ConfigError> {
        let span = raw.span();
        let raw = raw.into_inner();
        if raw.user.get_ref().is_empty() {
            return Err(self.error(raw.user.span(), format!("{key}.user"), "must not be empty"));
        }
        let secret = self
            .secret(
                &raw.secret,
                &raw.secret_file,
                &format!("{key}.secret"),
                &format!("{key}.secret-file"),
            )?
            .ok_or_else(|| {
                self.error(
                    span.clone(),
                    format!("{key}.secret"),
                    "missing: give secret or secret-file",
                )
            })?;
        let mutual_secret = self.secret(
            &raw.mutual_secret,
            &raw.mutual_secret_file,
            &format!("{key}.mutual-secret"),
            &format!("{key}.mutual-secret-file"),
        )?;
        let mutual_user = raw.mutual_user.as_ref().map(|u| u.get_ref().clone());
        if mutual_user.is_some() != mutual_secret.is_some() {
            return Err(self.error(
                span,
                format!("{key}.mutual-user"),
                "mutual CHAP needs both mutual-user and mutual-secret (or mutual-secret-file)",
            ));
        }
        if mutual_secret.as_ref() == Some(&secret) {
            // RFC 7143 12.1.3: using one secret in both directions enables reflection attacks.
            let span = raw
                .mutual_secret
                .as_ref()
                .or(raw.mutual_secret_file.as_ref())
                .map_or(span, Spanned::span);
            return Err(self.error(
                span,
                format!("{key}.mutual-secret"),
                "must differ from secret (RFC 7143 12.1.3)",
            ));
        }
        let mut algorithms = Vec::new();
        match &raw.algorithms {
            None => algorithms.extend(ChapAlgorithm::STRONGEST_FIRST),
            Some(list) => {
                for (i, name) in list.get_ref().iter().enumerate() {
                    let algorithm =
                        ChapAlgorithm::deserialize(serde::de::value::StrDeserializer::<
                            serde::de::value::Error,
                        >::new(
                            &name.get_ref().to_ascii_lowercase()
                        ))
                        .map_err(|_| {
                            self.error(
                                name.span(),
                                format!("{key}.algorithms[{i}]"),
                                format!(
                                    "{:?} is not a CHAP algorithm (sha3-256, sha256, sha1, md5)",
                                    name.get_ref()
                                ),
                            )
                        })?;
                    if !algorithms.contains(&algorithm) {
                        algorithms.push(algorithm);
                    }
                }
                if algorithms.is_empty() {
                    return Err(self.error(
                        list.span(),
                        format!("{key}.algorithms"),
                        "needs at least one algorithm",
                    ));
                }
            }
        }
        Ok(ChapConfig {
            user: raw.user.into_inner(),
            secret,
            mutual_user,
            mutual_secret,
            algorithms,
        })
    }
}

/// The portal group used when none is configured: tag 1, active/optimized.
pub(crate) fn default_portal_group(portals: Vec<SocketAddr>) -> PortalGroupConfig {
    PortalGroupConfig {
        tag: 1,
        name: "tpg1".into(),
        portals,
        alua_state: AluaStateConfig::ActiveOptimized,
    }
}

pub(crate) fn check_size(size: u64, block_size: u32) -> Result<(), String> {
    if size == 0 {
        return Err("must be greater than zero".into());
    }
    if !size.is_multiple_of(u64::from(block_size)) {
        return Err(format!(
            "{size} bytes is not a whole number of {block_size}-byte blocks"
        ));
    }
    Ok(())
}

fn check_serial(serial: &str) -> Result<(), String> {
    if serial.is_empty() || serial.len() > 64 || !serial.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{serial:?} must be 1..=64 printable ASCII characters without spaces"
        ));
    }
    Ok(())
}

/// Parses `None,CRC32C` (the iSCSI text-key list form, case-insensitive).
pub(crate) fn parse_digests(text: &str) -> Result<Vec<DigestConfig>, String> {
    let mut digests = Vec::new();
    for item in text.split(',') {
        let digest = match item.trim().to_ascii_lowercase().as_str() {
            "none" => DigestConfig::None,
            "crc32c" => DigestConfig::Crc32c,
            other => return Err(format!("{other:?} is not a digest (None or CRC32C)")),
        };
        if !digests.contains(&digest) {
            digests.push(digest);
        }
    }
    Ok(digests)
}

/// Removes `.` components and redundant separators so equal paths compare equal.
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// Reconstructs the key path (`target[0].lun[1].block-size`) of the line holding byte `offset`,
/// for errors the TOML parser reports with a span but without the key.
fn key_path_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let mut table = String::new();
    let mut counters: HashMap<String, usize> = HashMap::new();
    let mut last_key: Option<String> = None;
    let mut position = 0;
    for line in text.split_inclusive('\n') {
        let start = position;
        position += line.len();
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            let array = trimmed.starts_with("[[");
            let inner = trimmed.trim_start_matches('[');
            let name = inner
                .split(']')
                .next()
                .unwrap_or("")
                .trim()
                .replace(['"', ' '], "");
            if array {
                *counters.entry(name.clone()).or_insert(0) += 1;
                counters.retain(|k, _| !k.starts_with(&format!("{name}.")));
            }
            let mut path = String::new();
            let mut prefix = String::new();
            for (i, segment) in name.split('.').enumerate() {
                if i > 0 {
                    prefix.push('.');
                    path.push('.');
                }
                prefix.push_str(segment);
                path.push_str(segment);
                if let Some(count) = counters.get(&prefix) {
                    path.push_str(&format!("[{}]", count.saturating_sub(1)));
                }
            }
            table = path;
            last_key = None;
        } else if let (false, Some((key, _))) = (trimmed.starts_with('#'), trimmed.split_once('='))
        {
            last_key = Some(key.trim().trim_matches(['"', '\'']).to_string());
        }
        if (start..position).contains(&offset) || position == text.len() {
            return match (&last_key, table.is_empty()) {
                (Some(key), true) => Some(key.clone()),
                (Some(key), false) => Some(format!("{table}.{key}")),
                (None, false) => Some(table),
                (None, true) => None,
            };
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_paths() {
        let text = "[server]\nnop-interval = 5\n[[target]]\nname = \"x\"\n[[target.lun]]\npath = \"a\"\n[[target.lun]]\nblock-size = 1000\n[[target]]\n[target.chap]\nuser = 1\n";
        let at = |needle: &str| key_path_at(text, text.find(needle).unwrap()).unwrap();
        assert_eq!(at("5"), "server.nop-interval");
        assert_eq!(at("\"x\""), "target[0].name");
        assert_eq!(at("\"a\""), "target[0].lun[0].path");
        assert_eq!(at("1000"), "target[0].lun[1].block-size");
        assert_eq!(at("user"), "target[1].chap.user");
        assert_eq!(at("[[target.lun]]\nblock"), "target[0].lun[1]");
    }

    #[test]
    fn digests() {
        assert_eq!(
            parse_digests("None,CRC32C"),
            Ok(vec![DigestConfig::None, DigestConfig::Crc32c])
        );
        assert_eq!(parse_digests("crc32c"), Ok(vec![DigestConfig::Crc32c]));
        assert!(parse_digests("MD5").is_err());
    }
}
