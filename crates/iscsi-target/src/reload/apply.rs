//! Applying a reload: `prepare` opens and binds everything the new configuration needs
//! without changing what runs (and fails with the key at fault); `commit` then switches over
//! and cannot fail.

use super::{Change, ReloadReport};
use crate::config::{AclRule, ServeConfig};
use crate::listen;
use crate::server::{Portal, Server};
use crate::target::{alua_state, build_lu};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpListener;
use tracing::{error, info};

/// What `prepare` opened: new logical units and bound listeners, not yet in use.
pub(super) struct Prepared {
    luns: Vec<(String, u64, Arc<scsi::LogicalUnit>)>,
    listeners: Vec<(SocketAddr, Portal, TcpListener)>,
}

/// `target[i].lun[j]` of LUN `lun` of `target` in `config`.
fn lun_key(config: &ServeConfig, target: &str, lun: u64) -> String {
    let t = config.targets.iter().position(|t| t.name == target);
    let l = t.and_then(|t| {
        config
            .targets
            .get(t)?
            .luns
            .iter()
            .position(|l| l.lun == lun)
    });
    match (t, l) {
        (Some(t), Some(l)) => format!("target[{t}].lun[{l}]"),
        _ => "target".into(),
    }
}

fn portal_key(config: &ServeConfig, group: u16, addr: SocketAddr) -> String {
    let g = config.portal_groups.iter().position(|g| g.tag == group);
    let p = g.and_then(|g| {
        config
            .portal_groups
            .get(g)?
            .portals
            .iter()
            .position(|a| *a == addr)
    });
    match (g, p) {
        (Some(g), Some(p)) => format!("portal-group[{g}].portals[{p}]"),
        _ => "portal-group".into(),
    }
}

/// LUNs without a configured size whose backing file grew since it was opened (an
/// administrator extended it, e.g. with `truncate -s`): they grow to the file's size, in whole
/// blocks. The one part of a reload that looks at files rather than at the configuration.
pub(super) fn files_grown(server: &Server, new: &ServeConfig, changes: &[Change]) -> Vec<Change> {
    let mut grown = Vec::new();
    for target in &new.targets {
        let Some(runtime) = server.target(&target.name) else {
            continue;
        };
        let luns = runtime.luns.load();
        for lun in target.luns.iter().filter(|l| l.size.is_none()) {
            let Some(lu) = luns.get(lun.lun) else {
                continue;
            };
            let sized = changes.iter().any(|c| {
                matches!(c, Change::LunGrown { target: t, lun: l, .. } | Change::LunRemoved { target: t, lun: l }
                    if *t == target.name && *l == lun.lun)
            });
            let Ok(meta) = std::fs::metadata(&lun.path) else {
                continue;
            };
            let block = u64::from(lu.config().block_size);
            let size = meta.len() / block * block;
            if !sized && meta.is_file() && size > lu.block_count() * block {
                grown.push(Change::LunGrown {
                    target: target.name.clone(),
                    lun: lun.lun,
                    size,
                });
            }
        }
    }
    grown
}

/// What `prepare` did to files, to be undone when a later step fails.
#[derive(Default)]
struct Undo {
    /// Backing files it created.
    created: Vec<PathBuf>,
    /// Backing files it extended, with their former length (nothing was written past it:
    /// the LU had not grown yet).
    extended: Vec<(PathBuf, u64)>,
}

impl Undo {
    fn run(self) {
        for path in self.created {
            if let Err(e) = std::fs::remove_file(&path) {
                error!(path = %path.display(), "removing a file made by a refused reload: {e}");
            }
        }
        for (path, len) in self.extended {
            let shrunk = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(len));
            if let Err(e) = shrunk {
                error!(path = %path.display(), "restoring the size of a file after a refused reload: {e}");
            }
        }
    }
}

/// Opens the backing files of added LUNs, extends those of grown LUNs, binds added portals.
/// An error is `(key, message)`; then what was opened is closed again, and files created or
/// extended are removed or cut back.
pub(super) async fn prepare(
    server: &Server,
    new: &ServeConfig,
    changes: &[Change],
) -> Result<Prepared, (String, String)> {
    let mut prepared = Prepared {
        luns: Vec::new(),
        listeners: Vec::new(),
    };
    let mut undo = Undo::default();
    match prepare_into(server, new, changes, &mut prepared, &mut undo).await {
        Ok(()) => Ok(prepared),
        Err(e) => {
            drop(prepared);
            undo.run();
            Err(e)
        }
    }
}

async fn prepare_into(
    server: &Server,
    new: &ServeConfig,
    changes: &[Change],
    prepared: &mut Prepared,
    undo: &mut Undo,
) -> Result<(), (String, String)> {
    for change in changes {
        match change {
            Change::LunAdded { target, lun, .. } | Change::LunGrown { target, lun, .. } => {
                let key = lun_key(new, target, *lun);
                let (Some(runtime), Some(config)) = (
                    server.target(target),
                    new.target(target)
                        .and_then(|t| t.luns.iter().find(|l| l.lun == *lun)),
                ) else {
                    return Err((key, "not found".into()));
                };
                let fail = |e: &dyn std::fmt::Display| (format!("{key}.path"), e.to_string());
                if let Change::LunGrown { size, .. } = change {
                    let exported = runtime
                        .luns
                        .load()
                        .get(*lun)
                        .map_or(0, |lu| lu.block_count() * u64::from(lu.config().block_size));
                    if *size < exported {
                        return Err((
                            format!("{key}.size"),
                            format!(
                                "{size} bytes is less than the {exported} bytes LUN {lun} \
                                 exports; shrinking is refused"
                            ),
                        ));
                    }
                }
                // Creates a missing file, extends a short one; refuses to shrink.
                let before = std::fs::metadata(&config.path).ok();
                let after = config.ensure_backing_file().map_err(|e| fail(&e))?;
                match before {
                    // An RBD image is the cluster's: nothing here to undo.
                    None if config.rbd.is_some() => {}
                    None => undo.created.push(config.path.clone()),
                    Some(m) if m.is_file() && m.len() < after => {
                        undo.extended.push((config.path.clone(), m.len()))
                    }
                    Some(_) => {}
                }
                if let Change::LunAdded { .. } = change {
                    let lu = build_lu(target, config, &runtime.tpgs).map_err(|e| {
                        let mut text = e.to_string();
                        let mut source = std::error::Error::source(&e);
                        while let Some(s) = source {
                            text.push_str(&format!(": {s}"));
                            source = s.source();
                        }
                        fail(&text)
                    })?;
                    prepared.luns.push((target.clone(), *lun, lu));
                }
            }
            Change::PortalAdded { group, addr } => {
                let (portal, listener) =
                    listen::bind(*group, *addr, &new.limits)
                        .await
                        .map_err(|e| {
                            let reason = std::error::Error::source(&e)
                                .map(|s| s.to_string())
                                .unwrap_or_default();
                            (
                                portal_key(new, *group, *addr),
                                format!("cannot listen on {addr}: {reason}"),
                            )
                        })?;
                prepared.listeners.push((*addr, portal, listener));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A logical unit taken out of the LUN map, still finishing the commands routed to it.
pub(super) struct Retired {
    target: String,
    lun: u64,
    lu: Arc<scsi::LogicalUnit>,
}

/// What a commit took out of service, for [`retire`]: LUs to flush and release, and removed
/// portals whose listening sockets are closing.
pub(super) struct Retirement {
    luns: Vec<Retired>,
    portals: Vec<crate::listen::Listener>,
}

/// How long a reload waits for a removed portal's socket to close.
const PORTAL_CLOSE: std::time::Duration = std::time::Duration::from_secs(10);

/// Switches the server over to `new`. Infallible: everything that could fail was prepared.
/// Returns what it took out of service, for [`retire`].
pub(super) fn commit(
    server: &Arc<Server>,
    new: ServeConfig,
    file: PathBuf,
    changes: Vec<Change>,
    prepared: Prepared,
) -> (ReloadReport, Retirement) {
    let mut report = ReloadReport {
        file,
        changes: Vec::new(),
        sessions_ended: 0,
        connections_ended: 0,
        others: Vec::new(),
    };
    let mut retired = Retirement {
        luns: swap_lun_maps(server, &changes, prepared.luns),
        portals: Vec::new(),
    };
    for change in changes {
        let keep = match &change {
            Change::LunGrown { target, lun, size } => grow(server, target, *lun, *size),
            Change::PortalRemoved { addr, .. } => {
                if let Some((ended, listener)) = remove_portal(server, *addr) {
                    report.connections_ended += ended;
                    retired.portals.push(listener);
                }
                true
            }
            Change::AluaChanged { group, to, .. } => {
                for t in server.targets.iter().filter(|t| t.on_portal_group(*group)) {
                    // Each LU raises ASYMMETRIC ACCESS STATE CHANGED on every nexus.
                    t.tpgs.set_state(*group, alua_state(*to));
                }
                true
            }
            _ => true,
        };
        if keep {
            report.changes.push(change);
        }
    }
    for t in &server.targets {
        if let Some(config) = new.target(&t.name) {
            t.set_config(Arc::new(config.clone()));
        }
    }
    for change in &report.changes {
        let (target, all) = match change {
            Change::AclChanged { target } => (target, false),
            Change::ChapChanged { target } => (target, true),
            _ => continue,
        };
        let Some(t) = server.target(target) else {
            continue;
        };
        let acl = t.config().acl.clone();
        for session in server.sessions_of(t) {
            if session.closing.is_cancelled() {
                continue; // ended already (ACL and CHAP both changed, or a logout)
            }
            let allowed = !all
                && session
                    .connections
                    .lock()
                    .iter()
                    .all(|c| AclRule::allows(&acl, &session.initiator_name, c.peer.ip()));
            if !allowed {
                info!(initiator = %session.initiator_name, tsih = session.tsih, target = %t.name,
                    "session ends: it lost access in the reload");
                session.close_all();
                report.sessions_ended += 1;
            }
        }
    }
    {
        let mut listeners = server.listeners.lock();
        for (configured, portal, listener) in prepared.listeners {
            info!(portal = %portal.addr, tpgt = portal.tpgt, "portal added; listening");
            listeners.push(listen::spawn(server, configured, portal, listener));
        }
    }
    server.refresh_portals();
    server.set_config(Arc::new(new));
    (report, retired)
}

/// Flushes removed LUs and gives up their backing files, so a later reload can export the
/// same file again at once (connections may hold the old map until their next command).
pub(super) async fn retire(retired: Retirement) {
    // A removed portal's socket closes on the login thread: the reload ends once it has, so
    // that nothing connects to a portal the reload reported removed.
    for listener in &retired.portals {
        listener.wait_closed(PORTAL_CLOSE).await;
    }
    for Retired { target, lun, lu } in retired.luns {
        let flushed = tokio::task::spawn_blocking(move || {
            let result = lu.config().device.flush();
            lu.config().device.release();
            result
        })
        .await;
        if let Ok(Err(e)) = flushed {
            error!(%target, lun, "flushing a removed LUN failed: {e}");
        }
    }
}

/// Installs each target's new LUN map and raises REPORTED LUNS DATA HAS CHANGED. Done under
/// the session table lock, which logins hold while registering with the LUs, so every
/// session is either registered with the new LUs here or logs in against the new map.
fn swap_lun_maps(
    server: &Server,
    changes: &[Change],
    mut added: Vec<(String, u64, Arc<scsi::LogicalUnit>)>,
) -> Vec<Retired> {
    let mut retired = Vec::new();
    for t in &server.targets {
        let removed: Vec<u64> = changes
            .iter()
            .filter_map(|c| match c {
                Change::LunRemoved { target, lun } if *target == t.name => Some(*lun),
                _ => None,
            })
            .collect();
        let mine: Vec<(u64, Arc<scsi::LogicalUnit>)> = added
            .iter()
            .filter(|(target, _, _)| *target == t.name)
            .map(|(_, lun, lu)| (*lun, lu.clone()))
            .collect();
        added.retain(|(target, _, _)| *target != t.name);
        if removed.is_empty() && mine.is_empty() {
            continue;
        }
        let numbers: Vec<u64> = mine.iter().map(|(lun, _)| *lun).collect();
        let old = {
            let sessions = server.sessions.lock();
            let old = t.luns.load();
            let map = Arc::new(old.with_changes(&removed, mine));
            t.luns.store(map.clone());
            map.inventory_changed(
                &numbers,
                sessions
                    .by_tsih
                    .values()
                    .filter(|s| s.target.as_ref().is_some_and(|x| Arc::ptr_eq(x, t)))
                    .map(|s| &s.nexus),
            );
            old
        };
        // Commands already running on a removed LU finish on their own reference to it.
        retired.extend(removed.into_iter().filter_map(|lun| {
            Some(Retired {
                target: t.name.clone(),
                lun,
                lu: old.get(lun)?.clone(),
            })
        }));
    }
    retired
}

/// Grows a LUN to `size` bytes (its file was extended in `prepare`); false when it already
/// had that size.
fn grow(server: &Server, target: &str, lun: u64, size: u64) -> bool {
    let Some(lu) = server
        .target(target)
        .and_then(|t| t.luns.load().get(lun).cloned())
    else {
        return false;
    };
    match lu.grow(size) {
        Ok(grown) => grown,
        Err(e) => {
            error!(%target, lun, "growing the LUN failed: {e}");
            false
        }
    }
}

/// Stops the listener configured as `addr` and ends the connections it accepted; returns how
/// many logged-in connections ended, and the listener (its socket closes shortly after).
fn remove_portal(server: &Server, addr: SocketAddr) -> Option<(usize, crate::listen::Listener)> {
    let listener = {
        let mut listeners = server.listeners.lock();
        let position = listeners.iter().position(|l| l.configured == addr)?;
        listeners.remove(position)
    };
    let sessions: Vec<_> = server.sessions.lock().by_tsih.values().cloned().collect();
    let ended = sessions
        .iter()
        .map(|s| {
            let connections = s.connections.lock();
            connections
                .iter()
                .filter(|c| listener.accepted(c.portal))
                .count()
        })
        .sum();
    // Every connection's close token is a child of this one (those still logging in too).
    listener.stop.cancel();
    info!(portal = %listener.portal.addr, connections = ended, "portal removed");
    Some((ended, listener))
}
