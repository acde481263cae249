//! The resolved, validated configuration that `lanes serve` runs from.
//!
//! Everything here has already been checked: names are valid iSCSI names, LUN numbers are unique,
//! portal-group tags exist, sizes are whole blocks. The driver never sees a raw TOML value. Three
//! ways in, all ending in the same [`ServeConfig`]:
//!
//! - [`ServeConfig::from_cli`]: the embedded default (one target, one 1 GiB LUN, one portal group
//!   on `0.0.0.0:3260`), or a TOML file given with `--config`, with the command-line flags applied
//!   on top (the override rules are documented on [`CliOverrides`]).
//! - [`ServeConfig::from_toml_file`] / [`ServeConfig::from_toml_str`]: the file format, whose
//!   schema is documented in [`file`].
//!
//! Errors ([`ConfigError`]) name the file, line, column and key path, e.g.
//! `lanes.toml:14:1: target[0].lun[1].block-size: must be 512 or 4096, got 1000`.

mod acl;
mod chap;
mod cli;
pub mod cluster;
mod error;
pub mod file;
mod identity;
mod limits;
mod name;
mod show;
mod units;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use acl::{AclRule, IpNetwork};
pub use chap::{ChapAlgorithm, ChapConfig, Secret};
pub use cli::{default_target_name, parse_portal, CliOverrides, LunSpec};
pub use cluster::ClusterConfig;
pub use error::ConfigError;
pub use identity::{default_serial, naa_id, wwid_string, NAA_COMPANY_ID};
pub use limits::{defaults as limit_defaults, LimitsConfig, MAX_COMMANDS_PER_SESSION};
pub use name::validate_iscsi_name;
pub use units::{parse_duration, parse_size};

/// Default iSCSI port (RFC 7143 13.2: well-known port 3260).
pub const DEFAULT_ISCSI_PORT: u16 = 3260;
/// Default NOP-In interval: how often an idle connection is pinged.
pub const DEFAULT_NOP_INTERVAL: Duration = Duration::from_secs(5);
/// Default NOP-In timeout: an unanswered ping for this long drops the connection.
pub const DEFAULT_NOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Default data directory, relative to the working directory.
pub const DEFAULT_DATA_DIR: &str = "./lanes-data";
/// Size of the default LUN created when none is configured: 1 GiB, sparse.
pub const DEFAULT_LUN_SIZE: u64 = 1 << 30;
/// Highest LUN number accepted: the SAM flat-space addressing limit, which every initiator handles.
pub const MAX_LUN: u64 = 16383;

/// Everything `lanes serve` needs to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    pub targets: Vec<TargetConfig>,
    pub portal_groups: Vec<PortalGroupConfig>,
    /// CHAP for discovery sessions (SendTargets); `None` = discovery without authentication.
    pub discovery_auth: Option<ChapConfig>,
    /// Prometheus metrics listener; off unless configured.
    pub metrics_addr: Option<SocketAddr>,
    /// Unix socket answering `lanes status`; defaults to `<data_dir>/lanes.sock`.
    pub status_socket: Option<PathBuf>,
    /// Idle time after which the target sends a NOP-In ping; zero disables pings.
    pub nop_interval: Duration,
    /// How long an unanswered NOP-In may stay unanswered before the connection is dropped.
    pub nop_timeout: Duration,
    /// Where default backing files and runtime state live.
    pub data_dir: PathBuf,
    /// Bounds on what peers can make the server hold (`[limits]`).
    pub limits: LimitsConfig,
    /// `[cluster]`: this server is one node of an HA pair; `portal_groups` are then this
    /// node's own groups (the peer's are in [`ClusterConfig::groups`]).
    pub cluster: Option<ClusterConfig>,
}

/// A target portal group: a set of portals sharing one TPGT, which is also the ALUA target port
/// group id reported in REPORT TARGET PORT GROUPS. Connections of one MC/S session must all use
/// portals of one group (RFC 7143 4.4.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalGroupConfig {
    /// TPGT, 1..=65535.
    pub tag: u16,
    pub name: String,
    /// Listening addresses; `0.0.0.0` / `[::]` are expanded by the driver into every local
    /// address when answering SendTargets.
    pub portals: Vec<SocketAddr>,
    pub alua_state: AluaStateConfig,
}

/// Asymmetric access state of a target port group (SPC-4 5.16.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AluaStateConfig {
    #[default]
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    Transitioning,
}

impl AluaStateConfig {
    /// The ASYMMETRIC ACCESS STATE code of SPC-4 table 166.
    pub fn code(self) -> u8 {
        match self {
            AluaStateConfig::ActiveOptimized => 0x0,
            AluaStateConfig::ActiveNonOptimized => 0x1,
            AluaStateConfig::Standby => 0x2,
            AluaStateConfig::Unavailable => 0x3,
            AluaStateConfig::Transitioning => 0xf,
        }
    }
}

/// Digest preference for HeaderDigest / DataDigest negotiation (RFC 7143 13.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestConfig {
    None,
    Crc32c,
}

impl DigestConfig {
    /// The value as spelled in the iSCSI text key.
    pub fn as_key_value(self) -> &'static str {
        match self {
            DigestConfig::None => "None",
            DigestConfig::Crc32c => "CRC32C",
        }
    }
}

/// One exported iSCSI target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    /// `iqn.`, `eui.` or `naa.` name, validated per RFC 7143 4.2.7.
    pub name: String,
    /// TargetAlias sent at login.
    pub alias: Option<String>,
    pub luns: Vec<LunConfig>,
    /// Portal groups this target is reachable on; resolved, never empty.
    pub portal_groups: Vec<u16>,
    /// Who may log in; empty = everyone.
    pub acl: Vec<AclRule>,
    pub chap: Option<ChapConfig>,
    /// Whether one initiator may hold several sessions (one per path, as dm-multipath wants).
    pub allow_multiple_sessions: bool,
    /// MaxConnections offered per session (MC/S), 1..=65535.
    pub max_connections: u16,
    /// HeaderDigest values offered, most preferred first.
    pub header_digest: Vec<DigestConfig>,
    /// DataDigest values offered, most preferred first.
    pub data_digest: Vec<DigestConfig>,
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    /// MaxRecvDataSegmentLength the target declares (what it is willing to receive).
    pub max_recv_data_segment_length: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u16,
}

/// What lanes offers for the negotiated keys when the configuration says nothing. RFC 7143's
/// own defaults (8 KiB segments, InitialR2T=Yes, one outstanding R2T) cost a round trip per
/// write and many PDUs per MiB; these are what fast targets offer. The result of negotiation
/// is still bounded by what the initiator proposes (RFC 7143 13).
pub mod offered_defaults {
    pub const MAX_CONNECTIONS: u16 = 32;
    pub const FIRST_BURST_LENGTH: u32 = 262_144;
    pub const MAX_BURST_LENGTH: u32 = 1_048_576;
    pub const MAX_RECV_DATA_SEGMENT_LENGTH: u32 = 262_144;
    pub const IMMEDIATE_DATA: bool = true;
    pub const INITIAL_R2T: bool = false;
    pub const MAX_OUTSTANDING_R2T: u16 = 16;
    /// Smallest and largest legal value of the three length keys (RFC 7143 13.12-13.14).
    pub const LENGTH_RANGE: std::ops::RangeInclusive<u32> = 512..=16_777_215;
}

impl TargetConfig {
    /// A target with every setting at its default and no LUNs.
    pub fn with_defaults(name: String, portal_groups: Vec<u16>) -> TargetConfig {
        use offered_defaults as d;
        TargetConfig {
            name,
            alias: None,
            luns: Vec::new(),
            portal_groups,
            acl: Vec::new(),
            chap: None,
            allow_multiple_sessions: true,
            max_connections: d::MAX_CONNECTIONS,
            header_digest: vec![DigestConfig::None, DigestConfig::Crc32c],
            data_digest: vec![DigestConfig::None, DigestConfig::Crc32c],
            first_burst_length: d::FIRST_BURST_LENGTH,
            max_burst_length: d::MAX_BURST_LENGTH,
            max_recv_data_segment_length: d::MAX_RECV_DATA_SEGMENT_LENGTH,
            immediate_data: d::IMMEDIATE_DATA,
            initial_r2t: d::INITIAL_R2T,
            max_outstanding_r2t: d::MAX_OUTSTANDING_R2T,
        }
    }
}

/// One logical unit backed by a file or block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LunConfig {
    pub lun: u64,
    pub path: PathBuf,
    /// Size in bytes; `None` = the size of the existing file. When set and the file is missing,
    /// [`LunConfig::ensure_backing_file`] creates it sparse.
    pub size: Option<u64>,
    /// Logical block size, 512 or 4096.
    pub block_size: u32,
    /// Unit serial number (VPD page 0x80); always filled in after resolution, defaulting to
    /// [`default_serial`] so it is stable across restarts and identical on every portal.
    pub serial: Option<String>,
    pub read_only: bool,
    /// Whether the WCE bit is reported and writes may be cached until SYNCHRONIZE CACHE.
    pub write_cache: bool,
    /// Test harness only (`blockstore::VolatileDevice`): writes stay in process memory until
    /// a flush, so kill -9 of the server loses what a power loss would.
    pub volatile_cache: bool,
    /// The LUN is an RBD image (`path` then only names it, as `rbd:POOL/IMAGE`).
    pub rbd: Option<lanes_rbd::RbdSource>,
}

impl LunConfig {
    /// A LUN with default settings (512-byte blocks, writable, write cache on).
    pub fn new(lun: u64, path: PathBuf) -> LunConfig {
        LunConfig {
            lun,
            path,
            size: None,
            block_size: 512,
            serial: None,
            read_only: false,
            write_cache: true,
            volatile_cache: false,
            rbd: None,
        }
    }

    /// The serial number to report: the configured one or the stable default.
    pub fn effective_serial(&self, target_name: &str) -> String {
        self.serial
            .clone()
            .unwrap_or_else(|| default_serial(target_name, self.lun))
    }

    /// Creates the backing file (sparse, with parent directories) if it is missing, or extends a
    /// regular file that is smaller than the configured size. Returns the size in bytes.
    ///
    /// Never shrinks: a file larger than `size` is an error, because exporting less than the
    /// file would silently hide data a host wrote. Block devices are left as they are.
    pub fn ensure_backing_file(&self) -> std::io::Result<u64> {
        use std::io::{Error, ErrorKind};
        if self.rbd.is_some() {
            // The image exists in the cluster (`rbd create`); its size is its own.
            return Ok(self.size.unwrap_or(0));
        }
        let path = &self.path;
        match std::fs::metadata(path) {
            Ok(meta) if !meta.is_file() => Ok(meta.len()),
            Ok(meta) => match self.size {
                None => Ok(meta.len()),
                Some(size) if meta.len() == size => Ok(size),
                Some(size) if meta.len() < size => {
                    if self.read_only {
                        return Err(Error::new(
                            ErrorKind::InvalidInput,
                            format!(
                                "{}: read-only LUN is {} bytes, smaller than the configured {size}",
                                path.display(),
                                meta.len()
                            ),
                        ));
                    }
                    let file = std::fs::OpenOptions::new().write(true).open(path)?;
                    file.set_len(size)?;
                    Ok(size)
                }
                Some(size) => Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "{}: file is {} bytes, larger than the configured size {size}; \
                         refusing to shrink it (remove `size` to export the whole file)",
                        path.display(),
                        meta.len()
                    ),
                )),
            },
            Err(err) if err.kind() == ErrorKind::NotFound => {
                let Some(size) = self.size else {
                    return Err(Error::new(
                        ErrorKind::NotFound,
                        format!(
                            "{}: file does not exist and no size was given to create it",
                            path.display()
                        ),
                    ));
                };
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)?;
                }
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(path)?;
                file.set_len(size)?;
                Ok(size)
            }
            Err(err) => Err(err),
        }
    }
}

impl ServeConfig {
    /// Parses and validates a TOML configuration file.
    pub fn from_toml_file(path: &Path) -> Result<ServeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        ServeConfig::from_toml_str(&text, path)
    }

    /// Parses and validates TOML text; `path` names the file in errors and is the base for
    /// relative paths inside it.
    pub fn from_toml_str(text: &str, path: &Path) -> Result<ServeConfig, ConfigError> {
        file::parse(text, path)
    }

    /// Builds the configuration from command-line flags: the embedded default, or the
    /// `--config` file, with the flags applied on top (see [`CliOverrides`] for the rules).
    pub fn from_cli(cli: &CliOverrides) -> Result<ServeConfig, ConfigError> {
        cli::build(cli)
    }

    /// The status socket path to use: the configured one or `<data_dir>/lanes.sock`.
    pub fn status_socket_path(&self) -> PathBuf {
        self.status_socket
            .clone()
            .unwrap_or_else(|| self.data_dir.join("lanes.sock"))
    }

    /// Looks up a target by name.
    pub fn target(&self, name: &str) -> Option<&TargetConfig> {
        self.targets.iter().find(|target| target.name == name)
    }

    /// Looks up a portal group by tag.
    pub fn portal_group(&self, tag: u16) -> Option<&PortalGroupConfig> {
        self.portal_groups.iter().find(|group| group.tag == tag)
    }

    /// Creates the data directory and every missing backing file (see
    /// [`LunConfig::ensure_backing_file`]). Call after validation, before serving.
    pub fn prepare_storage(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.data_dir)?;
        for target in &self.targets {
            for lun in &target.luns {
                lun.ensure_backing_file()?;
            }
        }
        Ok(())
    }
}
