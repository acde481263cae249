//! The pure part of a reload: what differs between the running and the new configuration,
//! as a list of [`Change`]s the server can apply live, or the first difference it cannot.

use crate::config::{AluaStateConfig, LunConfig, ServeConfig, TargetConfig};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

/// One difference a running server applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    LunAdded {
        target: String,
        lun: u64,
        path: PathBuf,
    },
    LunRemoved {
        target: String,
        lun: u64,
    },
    /// The LUN's configured size grew (or was set where it was the file's size).
    LunGrown {
        target: String,
        lun: u64,
        size: u64,
    },
    /// Sessions no longer allowed end; new logins are checked against the new list.
    AclChanged {
        target: String,
    },
    /// Every session of the target ends: it authenticated with credentials that changed.
    ChapChanged {
        target: String,
    },
    /// Keys offered to new logins (negotiation, alias, multiple sessions) changed.
    LoginKeysChanged {
        target: String,
        keys: Vec<&'static str>,
    },
    PortalAdded {
        group: u16,
        addr: SocketAddr,
    },
    /// Its listener stops and the connections that came through it end.
    PortalRemoved {
        group: u16,
        addr: SocketAddr,
    },
    PortalGroupRenamed {
        group: u16,
        name: String,
    },
    AluaChanged {
        group: u16,
        from: AluaStateConfig,
        to: AluaStateConfig,
    },
    DiscoveryAuthChanged,
    /// NOP-In interval or timeout; applies to connections that log in afterwards.
    NopTimersChanged,
}

/// A difference that needs a restart: the key (`target[0].lun[1].block-size`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct NotLive {
    pub key: String,
    pub message: String,
}

fn not_live(key: impl Into<String>, message: impl Into<String>) -> NotLive {
    NotLive {
        key: key.into(),
        message: message.into(),
    }
}

fn alua_name(state: AluaStateConfig) -> &'static str {
    match state {
        AluaStateConfig::ActiveOptimized => "active-optimized",
        AluaStateConfig::ActiveNonOptimized => "active-non-optimized",
        AluaStateConfig::Standby => "standby",
        AluaStateConfig::Unavailable => "unavailable",
        AluaStateConfig::Transitioning => "transitioning",
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::LunAdded { target, lun, path } => {
                write!(f, "{target}: LUN {lun} added ({})", path.display())
            }
            Change::LunRemoved { target, lun } => write!(f, "{target}: LUN {lun} removed"),
            Change::LunGrown { target, lun, size } => {
                write!(f, "{target}: LUN {lun} grown to {size} bytes")
            }
            Change::AclChanged { target } => write!(f, "{target}: ACL changed"),
            Change::ChapChanged { target } => write!(f, "{target}: CHAP credentials changed"),
            Change::LoginKeysChanged { target, keys } => {
                write!(f, "{target}: login keys changed ({})", keys.join(", "))
            }
            Change::PortalAdded { group, addr } => {
                write!(f, "portal group {group}: portal {addr} added")
            }
            Change::PortalRemoved { group, addr } => {
                write!(f, "portal group {group}: portal {addr} removed")
            }
            Change::PortalGroupRenamed { group, name } => {
                write!(f, "portal group {group}: renamed {name:?}")
            }
            Change::AluaChanged { group, from, to } => write!(
                f,
                "portal group {group}: ALUA {} -> {}",
                alua_name(*from),
                alua_name(*to)
            ),
            Change::DiscoveryAuthChanged => write!(f, "discovery CHAP changed"),
            Change::NopTimersChanged => write!(f, "NOP-In interval/timeout changed"),
        }
    }
}

/// What must change to go from `old` to `new`, in a fixed order (server, portal groups,
/// targets in the order of `new`, LUNs by number); or the first difference that cannot be
/// applied while running. Keys name positions in `new` (or in `old` for what was removed).
pub fn diff(old: &ServeConfig, new: &ServeConfig) -> Result<Vec<Change>, NotLive> {
    let mut changes = Vec::new();
    if old.data_dir != new.data_dir {
        return Err(not_live("server.data-dir", "cannot change while running"));
    }
    if old.status_socket_path() != new.status_socket_path() {
        return Err(not_live(
            "server.status-socket",
            "cannot change while running",
        ));
    }
    if old.metrics_addr != new.metrics_addr {
        return Err(not_live("server.metrics", "cannot change while running"));
    }
    if old.limits != new.limits {
        return Err(not_live("limits", "cannot change while running (restart)"));
    }
    if (old.nop_interval, old.nop_timeout) != (new.nop_interval, new.nop_timeout) {
        changes.push(Change::NopTimersChanged);
    }
    if old.discovery_auth != new.discovery_auth {
        changes.push(Change::DiscoveryAuthChanged);
    }
    if old.cluster != new.cluster {
        return Err(not_live("cluster", "cannot change while running (restart)"));
    }
    diff_portal_groups(old, new, &mut changes)?;
    for (index, target) in old.targets.iter().enumerate() {
        if !new.targets.iter().any(|t| t.name == target.name) {
            let renamed = new
                .targets
                .get(index)
                .filter(|t| old.target(&t.name).is_none());
            return Err(match renamed {
                Some(t) => not_live(
                    format!("target[{index}].name"),
                    format!(
                        "renaming target {} to {} needs a restart",
                        target.name, t.name
                    ),
                ),
                None => not_live(
                    "target",
                    format!("removing target {} needs a restart", target.name),
                ),
            });
        }
    }
    for (index, target) in new.targets.iter().enumerate() {
        let key = format!("target[{index}]");
        let Some(before) = old.target(&target.name) else {
            return Err(not_live(
                format!("{key}.name"),
                format!("adding target {} needs a restart", target.name),
            ));
        };
        diff_target(before, target, &key, &mut changes)?;
    }
    if new.cluster.is_some()
        && changes.iter().any(|c| {
            matches!(
                c,
                Change::LunAdded { .. } | Change::LunRemoved { .. } | Change::LunGrown { .. }
            )
        })
    {
        return Err(not_live(
            "target.lun",
            "adding, removing or growing a replicated LUN needs a restart of both nodes",
        ));
    }
    Ok(changes)
}

fn diff_portal_groups(
    old: &ServeConfig,
    new: &ServeConfig,
    changes: &mut Vec<Change>,
) -> Result<(), NotLive> {
    for group in &old.portal_groups {
        if new.portal_group(group.tag).is_none() {
            return Err(not_live(
                "portal-group",
                format!("removing portal group {} needs a restart", group.tag),
            ));
        }
    }
    for (index, group) in new.portal_groups.iter().enumerate() {
        let key = format!("portal-group[{index}]");
        let Some(before) = old.portal_group(group.tag) else {
            return Err(not_live(
                format!("{key}.tag"),
                format!("adding portal group {} needs a restart", group.tag),
            ));
        };
        for (i, addr) in group.portals.iter().enumerate() {
            if before.portals.contains(addr) {
                continue;
            }
            if let Some(other) = old.portal_groups.iter().find(|g| g.portals.contains(addr)) {
                return Err(not_live(
                    format!("{key}.portals[{i}]"),
                    format!(
                        "{addr} moves from portal group {} to {}: remove it in one reload \
                         and add it in the next",
                        other.tag, group.tag
                    ),
                ));
            }
            changes.push(Change::PortalAdded {
                group: group.tag,
                addr: *addr,
            });
        }
        for addr in &before.portals {
            if !group.portals.contains(addr) {
                changes.push(Change::PortalRemoved {
                    group: group.tag,
                    addr: *addr,
                });
            }
        }
        if before.name != group.name {
            changes.push(Change::PortalGroupRenamed {
                group: group.tag,
                name: group.name.clone(),
            });
        }
        if before.alua_state != group.alua_state {
            changes.push(Change::AluaChanged {
                group: group.tag,
                from: before.alua_state,
                to: group.alua_state,
            });
        }
    }
    Ok(())
}

fn diff_target(
    old: &TargetConfig,
    new: &TargetConfig,
    key: &str,
    changes: &mut Vec<Change>,
) -> Result<(), NotLive> {
    let target = || new.name.clone();
    if old.portal_groups != new.portal_groups {
        return Err(not_live(
            format!("{key}.portal-groups"),
            "changing a target's portal groups needs a restart",
        ));
    }
    if old.acl != new.acl {
        changes.push(Change::AclChanged { target: target() });
    }
    if old.chap != new.chap {
        changes.push(Change::ChapChanged { target: target() });
    }
    let mut keys = Vec::new();
    let mut differs = |name: &'static str, differ: bool| {
        if differ {
            keys.push(name);
        }
    };
    differs("alias", old.alias != new.alias);
    differs(
        "allow-multiple-sessions",
        old.allow_multiple_sessions != new.allow_multiple_sessions,
    );
    differs(
        "max-connections",
        old.max_connections != new.max_connections,
    );
    differs("header-digest", old.header_digest != new.header_digest);
    differs("data-digest", old.data_digest != new.data_digest);
    differs(
        "first-burst-length",
        old.first_burst_length != new.first_burst_length,
    );
    differs(
        "max-burst-length",
        old.max_burst_length != new.max_burst_length,
    );
    differs(
        "max-recv-data-segment-length",
        old.max_recv_data_segment_length != new.max_recv_data_segment_length,
    );
    differs("immediate-data", old.immediate_data != new.immediate_data);
    differs("initial-r2t", old.initial_r2t != new.initial_r2t);
    differs(
        "max-outstanding-r2t",
        old.max_outstanding_r2t != new.max_outstanding_r2t,
    );
    if !keys.is_empty() {
        changes.push(Change::LoginKeysChanged {
            target: target(),
            keys,
        });
    }
    let mut removed: Vec<u64> = old
        .luns
        .iter()
        .map(|l| l.lun)
        .filter(|n| !new.luns.iter().any(|l| l.lun == *n))
        .collect();
    removed.sort_unstable();
    let mut lun_changes = Vec::new();
    for (index, lun) in new.luns.iter().enumerate() {
        let lun_key = format!("{key}.lun[{index}]");
        match old.luns.iter().find(|l| l.lun == lun.lun) {
            None => lun_changes.push(Change::LunAdded {
                target: target(),
                lun: lun.lun,
                path: lun.path.clone(),
            }),
            Some(before) => {
                if let Some(grown) = diff_lun(before, lun, &lun_key)? {
                    lun_changes.push(Change::LunGrown {
                        target: target(),
                        lun: lun.lun,
                        size: grown,
                    });
                }
            }
        }
    }
    changes.extend(removed.into_iter().map(|lun| Change::LunRemoved {
        target: target(),
        lun,
    }));
    lun_changes.sort_by_key(|c| match c {
        Change::LunAdded { lun, .. } | Change::LunGrown { lun, .. } => *lun,
        _ => 0,
    });
    changes.extend(lun_changes);
    Ok(())
}

/// A LUN kept under its number: only its size may grow. Returns the new size if it grew.
fn diff_lun(old: &LunConfig, new: &LunConfig, key: &str) -> Result<Option<u64>, NotLive> {
    let fixed = |name: &str, differ: bool, what: String| {
        if differ {
            Err(not_live(
                format!("{key}.{name}"),
                format!(
                    "{what} of LUN {} cannot change while it is exported; give the LUN \
                     another number, or remove it in one reload and add it in the next",
                    new.lun
                ),
            ))
        } else {
            Ok(())
        }
    };
    fixed(
        "path",
        old.path != new.path,
        format!(
            "the backing file ({} -> {})",
            old.path.display(),
            new.path.display()
        ),
    )?;
    fixed(
        "block-size",
        old.block_size != new.block_size,
        format!("the block size ({} -> {})", old.block_size, new.block_size),
    )?;
    fixed("serial", old.serial != new.serial, "the serial".into())?;
    fixed(
        "read-only",
        old.read_only != new.read_only,
        "read-only".into(),
    )?;
    fixed(
        "write-cache",
        old.write_cache != new.write_cache,
        "write-cache".into(),
    )?;
    fixed(
        "volatile-cache",
        old.volatile_cache != new.volatile_cache,
        "volatile-cache".into(),
    )?;
    match (old.size, new.size) {
        (Some(before), Some(after)) if after < before => Err(not_live(
            format!("{key}.size"),
            format!(
                "LUN {} would shrink from {before} to {after} bytes; shrinking would hide \
                 data hosts wrote, so it is refused",
                new.lun
            ),
        )),
        (Some(before), Some(after)) if after == before => Ok(None),
        (_, Some(after)) => Ok(Some(after)),
        (_, None) => Ok(None),
    }
}
