//! The command-line side of the configuration: the embedded default, `--lun` / `--portal`
//! specs, and how flags override or extend a `--config` file.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::file::{check_size, default_portal_group, normalize, parse_partial};
use super::{
    default_serial, parse_size, validate_iscsi_name, ConfigError, LunConfig, ServeConfig,
    TargetConfig, DEFAULT_DATA_DIR, DEFAULT_ISCSI_PORT, DEFAULT_LUN_SIZE, DEFAULT_NOP_INTERVAL,
    DEFAULT_NOP_TIMEOUT,
};

/// The `lanes serve` flags, already parsed into types.
///
/// Without `--config`, the embedded default is used: one target
/// `iqn.2026-11.io.lanes:<hostname>`, LUN 0 = `<data-dir>/disk0.img` (1 GiB, sparse, created if
/// missing, 512-byte blocks) and portal group 1 on `0.0.0.0:3260`. Flags then apply as follows,
/// with or without a file:
///
/// - `--portal` (repeatable) **replaces** the portals of portal group 1, creating the group if
///   the file has none; every CLI portal is in group 1 so one MC/S session can span them all.
///   Other groups in the file stay as they are.
/// - `--lun` (repeatable) **replaces** the default LUN; with a file it **appends** LUNs to the
///   first target, numbered after its highest LUN. Without a file they are LUN 0, 1, ...
/// - `--target-name` **renames** the first target (the only one without a file).
/// - `--metrics`, `--data-dir`, `--allow-multiple-sessions` **override** the file's value
///   (`--allow-multiple-sessions` for every target).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CliOverrides {
    pub config: Option<PathBuf>,
    pub portals: Vec<SocketAddr>,
    pub luns: Vec<LunSpec>,
    pub target_name: Option<String>,
    pub metrics: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub allow_multiple_sessions: Option<bool>,
    /// `--node`: which node of a `[cluster]` pair this server is (1 or 2).
    pub node: Option<u8>,
    /// `--replacement`: this node of a `[cluster]` pair has new disks (see
    /// [`super::ClusterConfig::replacement`]).
    pub replacement: bool,
}

/// A `--lun PATH[,size=SIZE][,block-size=512|4096]` or
/// `--lun rbd:POOL/IMAGE[,ceph-conf=FILE][,ceph-client=NAME][,watch-timeout=SECONDS][,block-size=...]`
/// value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LunSpec {
    pub path: PathBuf,
    pub size: Option<u64>,
    pub block_size: u32,
    pub rbd: Option<lanes_rbd::RbdSource>,
}

impl FromStr for LunSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<LunSpec, String> {
        let mut parts = text.split(',');
        let path = parts.next().unwrap_or_default();
        if path.is_empty() || path.contains('=') {
            return Err(format!(
                "{text:?}: expected PATH[,size=SIZE][,block-size=512|4096], the path comes first"
            ));
        }
        let rbd = match path.strip_prefix("rbd:") {
            Some(spec) => match spec.split_once('/') {
                Some((pool, image))
                    if !pool.is_empty() && !image.is_empty() && !image.contains('/') =>
                {
                    Some(lanes_rbd::RbdSource {
                        pool: pool.to_string(),
                        image: image.to_string(),
                        ceph_conf: std::env::var_os("CEPH_CONF")
                            .map_or_else(|| "/etc/ceph/ceph.conf".into(), PathBuf::from),
                        client: "admin".to_string(),
                        watch_timeout_s: lanes_rbd::DEFAULT_WATCH_TIMEOUT_S,
                    })
                }
                _ => return Err(format!("{text:?}: expected rbd:POOL/IMAGE")),
            },
            None => None,
        };
        let mut spec = LunSpec {
            path: PathBuf::from(path),
            size: None,
            block_size: 512,
            rbd,
        };
        for option in parts {
            match (option.split_once('='), spec.rbd.as_mut()) {
                (Some(("ceph-conf", value)), Some(rbd)) => rbd.ceph_conf = PathBuf::from(value),
                (Some(("ceph-client", value)), Some(rbd)) => rbd.client = value.to_string(),
                (Some(("watch-timeout", value)), Some(rbd)) => {
                    rbd.watch_timeout_s = lanes_rbd::parse_watch_timeout(value)
                        .map_err(|why| format!("{text:?}: watch-timeout {why}"))?;
                }
                (Some(("size", _)), Some(_)) => {
                    return Err(format!(
                        "{text:?}: an RBD image has its own size (change it with `rbd resize`)"
                    ))
                }
                _ => {}
            }
            if spec.rbd.is_some()
                && matches!(
                    option.split_once('='),
                    Some(("ceph-conf" | "ceph-client" | "watch-timeout", _))
                )
            {
                continue;
            }
            match option.split_once('=') {
                Some(("size", value)) => spec.size = Some(parse_size(value)?),
                Some(("block-size", "512")) => spec.block_size = 512,
                Some(("block-size", "4096")) => spec.block_size = 4096,
                Some(("block-size", other)) => {
                    return Err(format!("block-size must be 512 or 4096, got {other:?}"))
                }
                _ => {
                    return Err(format!(
                        "unknown option {option:?} (known: size=SIZE, block-size=512|4096; \
                         for rbd:POOL/IMAGE also ceph-conf=FILE, ceph-client=NAME, \
                         watch-timeout=SECONDS)"
                    ))
                }
            }
        }
        if let Some(size) = spec.size {
            check_size(size, spec.block_size).map_err(|reason| format!("size: {reason}"))?;
        }
        Ok(spec)
    }
}

/// Parses `ADDR:PORT`, `[IPV6]:PORT`, or an address alone (then `default_port` is used).
pub fn parse_portal(text: &str, default_port: u16) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bare = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
    if let Ok(ip) = bare.unwrap_or(text).parse::<IpAddr>() {
        if ip.is_ipv6() && bare.is_none() {
            return Err(format!(
                "{text:?}: write IPv6 portals in brackets, e.g. [{ip}]:{default_port}"
            ));
        }
        return Ok(SocketAddr::new(ip, default_port));
    }
    Err(format!(
        "{text:?} is not ADDR:PORT (e.g. 192.0.2.10:3260 or [2001:db8::10]:3260)"
    ))
}

/// `iqn.2026-11.io.lanes:<hostname>`, the hostname lowercased with anything outside
/// `a-z 0-9 - .` replaced by `-`.
pub fn default_target_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    format!("iqn.2026-11.io.lanes:{}", sanitize_hostname(&raw))
}

fn sanitize_hostname(raw: &str) -> String {
    let cleaned: String = raw
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let cleaned = cleaned.trim_matches(['-', '.']);
    if cleaned.is_empty() {
        "localhost".into()
    } else {
        cleaned.chars().take(150).collect()
    }
}

fn embedded_default(data_dir: &Path) -> ServeConfig {
    let name = default_target_name();
    let mut target = TargetConfig::with_defaults(name, vec![1]);
    let mut lun = LunConfig::new(0, data_dir.join("disk0.img"));
    lun.size = Some(DEFAULT_LUN_SIZE);
    target.luns.push(lun);
    ServeConfig {
        targets: vec![target],
        portal_groups: vec![default_portal_group(vec![SocketAddr::from((
            [0, 0, 0, 0],
            DEFAULT_ISCSI_PORT,
        ))])],
        discovery_auth: None,
        metrics_addr: None,
        status_socket: None,
        nop_interval: DEFAULT_NOP_INTERVAL,
        nop_timeout: DEFAULT_NOP_TIMEOUT,
        data_dir: data_dir.to_path_buf(),
        limits: Default::default(),
        cluster: None,
    }
}

pub(crate) fn build(cli: &CliOverrides) -> Result<ServeConfig, ConfigError> {
    let from_file = cli.config.is_some();
    let mut config = match &cli.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
                path: path.clone(),
                source,
            })?;
            parse_partial(&text, path)?
        }
        None => embedded_default(&normalize(
            cli.data_dir
                .as_deref()
                .unwrap_or(Path::new(DEFAULT_DATA_DIR)),
        )),
    };
    if let Some(dir) = &cli.data_dir {
        config.data_dir = normalize(dir);
    }
    if let Some(node) = cli.node {
        if config.cluster.is_none() || !matches!(node, 1 | 2) {
            return Err(ConfigError::cli(
                "--node",
                "must be 1 or 2, with a --config file that has a [cluster] section",
            ));
        }
        super::cluster::select_node(&mut config, node);
    }
    if cli.replacement {
        match config.cluster.as_mut() {
            Some(c) => c.replacement = true,
            None => {
                return Err(ConfigError::cli(
                    "--replacement",
                    "needs a --config file with a [cluster] section",
                ))
            }
        }
    }
    if let Some(addr) = cli.metrics {
        config.metrics_addr = Some(addr);
    }
    if !cli.portals.is_empty() {
        apply_portals(&mut config, &cli.portals)?;
    }
    if config.targets.is_empty() && (cli.target_name.is_some() || !cli.luns.is_empty()) {
        let tags = config.portal_groups.iter().map(|g| g.tag).collect();
        config
            .targets
            .push(TargetConfig::with_defaults(default_target_name(), tags));
    }
    if let Some(name) = &cli.target_name {
        validate_iscsi_name(name).map_err(|reason| ConfigError::cli("--target-name", reason))?;
        if let Some(target) = config.targets.first_mut() {
            target.name = name.clone();
        }
    }
    if let Some(target) = config.targets.first_mut() {
        if !cli.luns.is_empty() && !from_file {
            target.luns.clear();
        }
        for spec in &cli.luns {
            let number = target.luns.iter().map(|l| l.lun + 1).max().unwrap_or(0);
            let mut lun = match &spec.rbd {
                Some(rbd) => {
                    let mut lun = LunConfig::new(number, spec.path.clone());
                    lun.rbd = Some(rbd.clone());
                    lun
                }
                None => LunConfig::new(number, normalize(&spec.path)),
            };
            lun.size = spec.size;
            lun.block_size = spec.block_size;
            target.luns.push(lun);
        }
    }
    for target in &mut config.targets {
        if let Some(allow) = cli.allow_multiple_sessions {
            target.allow_multiple_sessions = allow;
        }
        // A renamed target gets serials derived from its new name, unless set in the file.
        for lun in &mut target.luns {
            if lun.serial.is_none() || cli.target_name.is_some() && !from_file {
                lun.serial = Some(default_serial(&target.name, lun.lun));
            }
        }
    }
    check_complete(&config, cli.config.as_deref())?;
    Ok(config)
}

fn apply_portals(config: &mut ServeConfig, portals: &[SocketAddr]) -> Result<(), ConfigError> {
    for (i, portal) in portals.iter().enumerate() {
        if portals[..i].contains(portal) {
            return Err(ConfigError::cli(
                "--portal",
                format!("{portal} is given twice"),
            ));
        }
        if let Some(other) = config
            .portal_groups
            .iter()
            .find(|g| g.tag != 1 && g.portals.contains(portal))
        {
            return Err(ConfigError::cli(
                "--portal",
                format!("{portal} is already in portal group {}", other.tag),
            ));
        }
    }
    match config.portal_groups.iter_mut().find(|g| g.tag == 1) {
        Some(group) => group.portals = portals.to_vec(),
        None => {
            config
                .portal_groups
                .insert(0, default_portal_group(portals.to_vec()));
            // A file that named no portal groups for a target means "all of them".
            for target in &mut config.targets {
                if !target.portal_groups.contains(&1)
                    && target.portal_groups.len() + 1 == config.portal_groups.len()
                {
                    target.portal_groups.insert(0, 1);
                }
            }
        }
    }
    Ok(())
}

/// Checks what only the whole configuration can show: at least one target, every target with at
/// least one LUN, no backing file used twice.
pub(crate) fn check_complete(config: &ServeConfig, file: Option<&Path>) -> Result<(), ConfigError> {
    let complain = |key: String, message: String| match file {
        Some(file) => ConfigError::Invalid {
            location: super::error::Location {
                file: file.to_path_buf(),
                line: 1,
                column: 1,
            },
            key,
            message,
        },
        None => ConfigError::cli("--lun", message),
    };
    if config.targets.is_empty() {
        return Err(complain(
            "target".into(),
            "no [[target]] defined (add one, or pass --lun)".into(),
        ));
    }
    let mut paths: HashMap<&Path, String> = HashMap::new();
    for (t, target) in config.targets.iter().enumerate() {
        if target.luns.is_empty() {
            return Err(complain(
                format!("target[{t}].lun"),
                format!(
                    "target {} has no LUN (add [[target.lun]] or pass --lun)",
                    target.name
                ),
            ));
        }
        for (l, lun) in target.luns.iter().enumerate() {
            let key = format!("target[{t}].lun[{l}]");
            if let Some(previous) = paths.insert(&lun.path, key.clone()) {
                return Err(complain(
                    format!("{key}.path"),
                    format!(
                        "{} is already the backing file of {previous}",
                        lun.path.display()
                    ),
                ));
            }
        }
    }
    if let Some(cluster) = &config.cluster {
        if cluster.node == 0 {
            return Err(complain(
                "cluster.node".into(),
                "which node this server is: set node = 1 or 2, or pass lanes serve --node".into(),
            ));
        }
        if config.portal_groups.is_empty() {
            return Err(complain(
                "portal-group".into(),
                format!("no [[portal-group]] has node = {}", cluster.node),
            ));
        }
        // LUN N replicates on port + N under etcd key lun<N>: one number, one LUN.
        let mut numbers: HashMap<u64, String> = HashMap::new();
        for (t, target) in config.targets.iter().enumerate() {
            for (l, lun) in target.luns.iter().enumerate() {
                let key = format!("target[{t}].lun[{l}]");
                if let Some(previous) = numbers.insert(lun.lun, key.clone()) {
                    return Err(complain(
                        format!("{key}.lun"),
                        format!(
                            "LUN {} is also {previous}: with [cluster], LUN numbers are unique \
                             across targets",
                            lun.lun
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_specs() {
        let spec: LunSpec = "disk.img,size=1G,block-size=4096".parse().unwrap();
        assert_eq!(spec.size, Some(1 << 30));
        assert_eq!(spec.block_size, 4096);
        assert_eq!("d.img".parse::<LunSpec>().unwrap().size, None);
        for bad in [
            "",
            "size=1G",
            "d.img,size=12Q",
            "d.img,block-size=1000",
            "d.img,color=red",
            "d.img,size=1000,block-size=4096",
            "rbd:rbd/vol1,watch-timeout=1",
            "rbd:rbd/vol1,watch-timeout=soon",
            "d.img,watch-timeout=5",
        ] {
            assert!(bad.parse::<LunSpec>().is_err(), "{bad:?} accepted");
        }
        let why = "rbd:rbd/vol1,watch-timeout=61"
            .parse::<LunSpec>()
            .expect_err("61 s refused");
        assert!(
            why.contains("watch-timeout must be whole seconds from 2 to 60, got 61"),
            "{why}"
        );
        let rbd: LunSpec = "rbd:rbd/vol1,ceph-client=gw,watch-timeout=3"
            .parse()
            .unwrap();
        let source = rbd.rbd.expect("an RBD LUN");
        assert_eq!((source.client.as_str(), source.watch_timeout_s), ("gw", 3));
        let plain: LunSpec = "rbd:rbd/vol1".parse().unwrap();
        assert_eq!(
            plain.rbd.unwrap().watch_timeout_s,
            lanes_rbd::DEFAULT_WATCH_TIMEOUT_S
        );
    }

    #[test]
    fn portals() {
        assert_eq!(
            parse_portal("[::1]:3261", 3260).unwrap().to_string(),
            "[::1]:3261"
        );
        assert_eq!(
            parse_portal("[::1]", 3260).unwrap().to_string(),
            "[::1]:3260"
        );
        assert_eq!(
            parse_portal("127.0.0.1", 3260).unwrap().to_string(),
            "127.0.0.1:3260"
        );
        assert!(parse_portal("::1", 3260).is_err());
        assert!(parse_portal("host:3260", 3260).is_err());
    }

    #[test]
    fn hostnames() {
        assert_eq!(sanitize_hostname("My_Host.example\n"), "my-host.example");
        assert_eq!(sanitize_hostname(""), "localhost");
        assert!(validate_iscsi_name(&default_target_name()).is_ok());
    }

    #[test]
    fn default_config() {
        let config = ServeConfig::from_cli(&CliOverrides::default()).unwrap();
        assert_eq!(config.targets.len(), 1);
        let target = &config.targets[0];
        assert!(target.name.starts_with("iqn.2026-11.io.lanes:"));
        assert_eq!(target.luns[0].path, PathBuf::from("lanes-data/disk0.img"));
        assert_eq!(target.luns[0].size, Some(1 << 30));
        assert_eq!(target.luns[0].block_size, 512);
        assert_eq!(config.portal_groups[0].tag, 1);
        assert_eq!(
            config.portal_groups[0].portals[0].to_string(),
            "0.0.0.0:3260"
        );
        assert_eq!(
            config.status_socket_path(),
            PathBuf::from("lanes-data/lanes.sock")
        );
    }

    #[test]
    fn cli_flags_replace_defaults() {
        let cli = CliOverrides {
            portals: vec![
                "127.0.0.1:3260".parse().unwrap(),
                "[::1]:3260".parse().unwrap(),
            ],
            luns: vec!["a.img,size=1M".parse().unwrap(), "b.img".parse().unwrap()],
            target_name: Some("iqn.2026-11.io.lanes:test".into()),
            allow_multiple_sessions: Some(false),
            ..CliOverrides::default()
        };
        let config = ServeConfig::from_cli(&cli).unwrap();
        assert_eq!(config.portal_groups.len(), 1);
        assert_eq!(config.portal_groups[0].portals.len(), 2);
        let target = &config.targets[0];
        assert_eq!(target.name, "iqn.2026-11.io.lanes:test");
        assert!(!target.allow_multiple_sessions);
        assert_eq!(
            target.luns.iter().map(|l| l.lun).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(
            target.luns[0].serial,
            Some(default_serial("iqn.2026-11.io.lanes:test", 0))
        );
    }

    #[test]
    fn duplicate_cli_paths_are_refused() {
        let cli = CliOverrides {
            luns: vec!["a.img,size=1M".parse().unwrap(), "./a.img".parse().unwrap()],
            ..CliOverrides::default()
        };
        let err = ServeConfig::from_cli(&cli).unwrap_err().to_string();
        assert!(err.contains("already the backing file"), "{err}");
    }
}
