//! `lanes serve`: flags -> validated [`ServeConfig`] -> backing files -> the target driver, and
//! the banner and the service manager's READY=1 once every portal is listening.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use lanes_iscsi_target::config::{naa_id, wwid_string, CliOverrides, LunSpec, ServeConfig};
use lanes_iscsi_target::ConfigSource;

use crate::banner::{Banner, BannerLun, BannerTarget};
use crate::notify;

/// Without --config: one target iqn.2026-11.io.lanes:<hostname>, LUN 0 = <data-dir>/disk0.img
/// (1 GiB, sparse, created if missing), portal group 1 on 0.0.0.0:3260.
///
/// With --config: --portal replaces the portals of portal group 1, --lun appends LUNs to the
/// first target, --target-name renames the first target, and --metrics, --data-dir and
/// --allow-multiple-sessions override the file. SIGHUP (or `lanes reload`) re-reads the file,
/// applies the same flags again and changes the running server without dropping the sessions
/// the change does not concern.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen on ADDR:PORT (IPv6 as [ADDR]:PORT); repeatable, all in portal group 1.
    #[arg(long = "portal", value_name = "ADDR:PORT", value_parser = parse_portal_arg)]
    portals: Vec<SocketAddr>,
    /// Export PATH[,size=SIZE][,block-size=512|4096] as the next LUN, or a Ceph RBD image as
    /// rbd:POOL/IMAGE[,ceph-conf=FILE][,ceph-client=NAME][,watch-timeout=S]; repeatable.
    #[arg(long = "lun", value_name = "SPEC")]
    luns: Vec<LunSpec>,
    /// iSCSI name of the target (iqn./eui./naa.).
    #[arg(long, value_name = "IQN")]
    target_name: Option<String>,
    /// Serve Prometheus metrics on ADDR:PORT (off by default).
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_metrics_arg)]
    metrics: Option<SocketAddr>,
    /// Directory for default backing files and the status socket [default: ./lanes-data].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Whether one initiator may open several sessions (one per path) [default: true].
    #[arg(long, value_name = "BOOL")]
    allow_multiple_sessions: Option<bool>,
    /// With a [cluster] section: which node of the HA pair this server is (overrides
    /// `[cluster] node`, so one file serves both nodes).
    #[arg(long, value_name = "1|2", value_parser = clap::value_parser!(u8).range(1..=2))]
    node: Option<u8>,
    /// With a [cluster] section: this node's disks are new (a replaced machine). A LUN that
    /// has no replication metadata yet starts outdated and is copied in full from the peer,
    /// never pairs on a partial resync. Harmless once the metadata exists.
    #[arg(long)]
    replacement: bool,
}

fn parse_portal_arg(text: &str) -> Result<SocketAddr, String> {
    lanes_iscsi_target::config::parse_portal(text, lanes_iscsi_target::config::DEFAULT_ISCSI_PORT)
}

fn parse_metrics_arg(text: &str) -> Result<SocketAddr, String> {
    lanes_iscsi_target::config::parse_portal(text, 9260)
}

impl ServeArgs {
    pub fn overrides(self) -> CliOverrides {
        CliOverrides {
            config: self.config,
            portals: self.portals,
            luns: self.luns,
            target_name: self.target_name,
            metrics: self.metrics,
            data_dir: self.data_dir,
            allow_multiple_sessions: self.allow_multiple_sessions,
            node: self.node,
            replacement: self.replacement,
        }
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let overrides = args.overrides();
    let overrides_config = overrides.config.clone();
    let config = ServeConfig::from_cli(&overrides)?;
    // A reload (SIGHUP, `lanes reload`) re-reads --config and applies the same flags again.
    let source = ConfigSource::from_cli(&overrides);
    config
        .prepare_storage()
        .context("preparing backing files")
        .map_err(|e| explain_read_only(e, &config, under_systemd()))?;
    // SMB shares ([[share]] in --config) are served next to the iSCSI target.
    let smb = crate::smb::start_for_serve(overrides_config.as_deref(), &config.data_dir)
        .await
        .context("starting the SMB server")?;
    let smb_reload =
        crate::smb::SmbReload::new(smb.as_ref().map(|(s, c)| (s, c.clone())), &config.data_dir);
    let smb = smb.map(|(s, _)| s);
    let smb_banner = smb.as_ref().map(crate::smb::banner);
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<lanes_iscsi_target::ServeInfo>();
    let banner_config = config.clone();
    let storage_config = config.clone();
    let printer = tokio::spawn(async move {
        if let Ok(info) = ready_rx.await {
            let info = ReadyInfo {
                portals: info.portals,
                management: info.management,
                targets: info.targets,
            };
            let portals = info.portals.len();
            print!("{}", banner_from(&banner_config, info).render());
            if let Some(text) = &smb_banner {
                print!("{text}");
            }
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            notify::notify_or_log(&format!(
                "READY=1\nSTATUS=serving on {portals} portal(s)\nMAINPID={}",
                std::process::id()
            ));
        }
    });
    // The driver handles SIGINT/SIGTERM itself: it drains running commands and flushes. This
    // task only tells the service manager that the stop has begun.
    let stop = notify::stop_signal();
    let stopping = tokio::spawn(async {
        match stop {
            Ok(stop) => {
                stop.await;
                notify::notify_or_log("STOPPING=1\nSTATUS=draining and flushing");
            }
            Err(e) => tracing::warn!("cannot watch SIGINT/SIGTERM to report STOPPING=1: {e}"),
        }
    });
    // The driver handles SIGINT/SIGTERM itself: it drains running commands and flushes.
    let sections: Vec<std::sync::Arc<dyn lanes_iscsi_target::StatusSection>> = smb
        .iter()
        .map(|s| {
            std::sync::Arc::new(crate::smb::SmbStatus(s.server.clone()))
                as std::sync::Arc<dyn lanes_iscsi_target::StatusSection>
        })
        .collect();
    let others = lanes_iscsi_target::OtherServices {
        status: sections,
        reload: vec![std::sync::Arc::new(smb_reload)],
    };
    let result = lanes_iscsi_target::serve_with(config, source, ready_tx, others).await;
    printer.abort();
    stopping.abort();
    drop(smb);
    result.map_err(|e| explain_read_only(e.into(), &storage_config, under_systemd()))?;
    Ok(())
}

/// Whether a service manager started us (systemd sets `$INVOCATION_ID` for every unit).
fn under_systemd() -> bool {
    std::env::var_os("INVOCATION_ID").is_some()
}

/// Under systemd, a read-only file system is the unit's `ProtectSystem=strict`, which leaves
/// only /var/lib/lanes writable: the error then names the directories a `ReadWritePaths=`
/// drop-in must add.
fn explain_read_only(
    error: anyhow::Error,
    config: &ServeConfig,
    under_systemd: bool,
) -> anyhow::Error {
    let read_only = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            == Some(libc::EROFS)
    });
    if !read_only || !under_systemd {
        return error;
    }
    let writable = std::path::Path::new("/var/lib/lanes");
    let mut directories: Vec<PathBuf> = std::iter::once(config.data_dir.clone())
        .chain(config.targets.iter().flat_map(|target| {
            target
                .luns
                .iter()
                .filter_map(|lun| lun.path.parent().map(PathBuf::from))
        }))
        .filter(|dir| !dir.starts_with(writable) && !dir.starts_with("/dev"))
        .collect();
    directories.sort();
    directories.dedup();
    let list = directories
        .iter()
        .map(|dir| dir.display().to_string())
        .collect::<Vec<_>>()
        .join(" ");
    anyhow::anyhow!(
        "{error:#}; lanes.service may write only below /var/lib/lanes (ProtectSystem=strict): \
         `systemctl edit lanes`, then add [Service] ReadWritePaths={list}"
    )
}

/// What the driver reports once it listens: bound portals (wildcards expanded) and LUN WWIDs.
#[derive(Debug, Clone, Default)]
pub struct ReadyInfo {
    pub portals: Vec<(u16, SocketAddr)>,
    /// Expanded wildcard addresses on the default route's interface.
    pub management: Vec<SocketAddr>,
    pub targets: Vec<(String, Vec<(u64, String)>)>,
}

fn banner_from(config: &ServeConfig, info: ReadyInfo) -> Banner {
    let targets = config
        .targets
        .iter()
        .map(|target| {
            let reported = info.targets.iter().find(|(name, _)| *name == target.name);
            let luns = target
                .luns
                .iter()
                .map(|lun| {
                    let wwid = reported
                        .and_then(|(_, luns)| luns.iter().find(|(n, _)| *n == lun.lun))
                        .map(|(_, wwid)| wwid.clone())
                        .unwrap_or_else(|| wwid_string(&naa_id(&target.name, lun)));
                    let size = lun
                        .size
                        .or_else(|| std::fs::metadata(&lun.path).ok().map(|m| m.len()))
                        .unwrap_or(0);
                    BannerLun {
                        lun: lun.lun,
                        size,
                        block_size: lun.block_size,
                        wwid,
                        path: lun.path.display().to_string(),
                    }
                })
                .collect();
            let portals = info
                .portals
                .iter()
                .filter(|(tag, _)| target.portal_groups.contains(tag))
                .copied()
                .collect();
            BannerTarget {
                name: target.name.clone(),
                portals,
                luns,
            }
        })
        .collect();
    Banner {
        targets,
        status_socket: config.status_socket_path().display().to_string(),
        metrics: config.metrics_addr,
        management: info.management,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lanes_iscsi_target::config::LunConfig;

    #[test]
    fn read_only_storage_under_systemd_names_the_directories() {
        let mut config = ServeConfig::from_cli(&CliOverrides {
            data_dir: Some("/var/lib/lanes".into()),
            ..CliOverrides::default()
        })
        .unwrap();
        let target = &mut config.targets[0];
        target
            .luns
            .push(LunConfig::new(1, "/srv/lanes/a.img".into()));
        target
            .luns
            .push(LunConfig::new(2, "/srv/lanes/b.img".into()));
        target.luns.push(LunConfig::new(3, "/dev/sdb".into()));
        let read_only = || {
            anyhow::Error::new(std::io::Error::from_raw_os_error(libc::EROFS))
                .context("preparing backing files")
        };
        let explained = explain_read_only(read_only(), &config, true).to_string();
        assert!(
            explained.starts_with("preparing backing files: Read-only file system"),
            "{explained}"
        );
        assert!(
            explained.ends_with("add [Service] ReadWritePaths=/srv/lanes"),
            "{explained}"
        );
        // Outside systemd, or for another error, the error stays as it is.
        let plain = explain_read_only(read_only(), &config, false);
        assert_eq!(format!("{plain:#}"), format!("{:#}", read_only()));
        let other = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(!format!("{:#}", explain_read_only(other, &config, true)).contains("ReadWrite"));
    }
}
