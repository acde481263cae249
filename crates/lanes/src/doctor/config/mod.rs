//! The host configuration that makes multipath work for the checked target: Linux (open-iscsi
//! and dm-multipath), Windows (MSiSCSI and MPIO) and VMware ESXi (software iSCSI and NMP),
//! ready to paste. Pure text generation from what the checks accepted: paths that failed are
//! never in it.

mod esxi;
mod linux;
mod windows;

use std::net::SocketAddr;

use super::checks::Grouping;

/// Everything the generators need.
#[derive(Debug, Clone, PartialEq)]
pub struct HostConfig {
    pub targets: Vec<TargetConfig>,
    pub chap_user: Option<String>,
    /// Where the CHAP secret is (never the secret itself: the commands read the file).
    pub chap_secret_file: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TargetConfig {
    pub name: String,
    /// The portals that passed every check, one login each.
    pub portals: Vec<SocketAddr>,
    /// Portals the target lists that must not be used (other LUN, unreachable).
    pub excluded: Vec<SocketAddr>,
    pub luns: Vec<ConfigLun>,
    pub grouping: Grouping,
    /// The target reported ALUA states (use the ALUA handler and priorities).
    pub alua: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigLun {
    pub lun: u64,
    /// The designator as VMware names devices (`naa.…`).
    pub id: String,
    /// The WWID as Linux shows it.
    pub wwid: String,
    /// The multipath alias, `/dev/mapper/ALIAS`.
    pub alias: String,
    pub vendor: String,
    pub product: String,
}

/// Every generated text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    pub linux_commands: String,
    pub multipath_conf: String,
    pub fstab: String,
    pub windows: String,
    pub esxi: String,
}

pub fn generate(config: &HostConfig) -> Generated {
    Generated {
        linux_commands: linux::commands(config),
        multipath_conf: linux::multipath_conf(config),
        fstab: linux::fstab(config),
        windows: windows::powershell(config),
        esxi: esxi::esxcli(config),
    }
}

/// A multipath alias from the target name's last part and the LUN: `store-lun0`.
pub fn alias_for(target: &str, lun: u64) -> String {
    let tail = target
        .rsplit_once(':')
        .map(|(_, t)| t)
        .or_else(|| target.rsplit_once('.').map(|(_, t)| t))
        .unwrap_or(target);
    let mut clean: String = tail
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    clean = clean.trim_matches('-').to_string();
    if clean.is_empty() {
        clean = "lanes".to_string();
    }
    format!("{clean}-lun{lun}")
}

/// Gives every LUN of every target a distinct alias (two targets may end alike).
pub fn make_aliases_unique(targets: &mut [TargetConfig]) {
    let mut seen: Vec<String> = Vec::new();
    for lun in targets.iter_mut().flat_map(|t| t.luns.iter_mut()) {
        let mut alias = lun.alias.clone();
        let mut n = 2;
        while seen.contains(&alias) {
            alias = format!("{}-{n}", lun.alias);
            n += 1;
        }
        lun.alias = alias.clone();
        seen.push(alias);
    }
}

/// `host:port` with IPv6 in brackets, as iscsiadm and esxcli take it.
fn portal_text(p: &SocketAddr) -> String {
    p.to_string()
}

#[cfg(test)]
mod tests;
