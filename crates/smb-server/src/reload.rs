//! Live reconfiguration of the SMB server (`lanes reload`, SIGHUP): shares added, removed or
//! changed and the users file re-read, without ending a session. A share that is removed or
//! changed is retired: its tree connects answer STATUS_NETWORK_NAME_DELETED to everything but
//! TREE_DISCONNECT (clients connect the tree again, and get the share as configured now, or
//! BAD_NETWORK_NAME once it is gone); its opens stay until the client closes them or
//! disconnects the tree. Users added or with a new password can log on at once; sessions
//! already set up stay. What needs the listening sockets or the negotiation to change
//! (`[smb]` listen, signing, server name, link speed, RSS, lowest dialect) is refused with its
//! key, and then nothing changes.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::config::SmbConfig;
use crate::state::{Server, Share};
use crate::users::Users;

/// Why a reload of the SMB part changes nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadRefused {
    #[error(
        "{key}: changing it needs a restart of lanes serve (the SMB server keeps the old value)"
    )]
    NotLive { key: &'static str },
    #[error(transparent)]
    Share(#[from] crate::ServeError),
}

/// A checked reload, ready to switch over.
pub struct PreparedReload {
    server: Arc<Server>,
    shares: Vec<Arc<Share>>,
    users: Arc<Users>,
    retired: Vec<Arc<Share>>,
    changes: Vec<String>,
}

impl PreparedReload {
    /// What switching over changes, one line each.
    pub fn changes(&self) -> &[String] {
        &self.changes
    }

    /// Switches over: the new shares and users serve every new request; retired shares'
    /// tree connects answer NETWORK_NAME_DELETED from now on.
    pub fn commit(self) {
        self.server.set_shares_and_users(self.shares, self.users);
        for share in &self.retired {
            share.retired.store(true, Ordering::Release);
        }
    }
}

/// The first setting of `[smb]` that differs between `old` and `new` and cannot change live.
fn not_live(old: &SmbConfig, new: &SmbConfig) -> Option<&'static str> {
    if old.listen != new.listen {
        return Some("smb.listen");
    }
    if old.signing_required != new.signing_required {
        return Some("smb.signing-required");
    }
    if old.server_name != new.server_name {
        return Some("smb.server-name");
    }
    if old.link_speed != new.link_speed {
        return Some("smb.link-speed");
    }
    if old.rss != new.rss {
        return Some("smb.rss");
    }
    if old.min_dialect != new.min_dialect {
        return Some("smb.min-dialect");
    }
    // Anything else but the shares and the users file.
    let strip = |c: &SmbConfig| {
        let mut c = c.clone();
        c.shares.clear();
        c.users_file = Default::default();
        c
    };
    (strip(old) != strip(new)).then_some("smb")
}

impl Server {
    /// Checks `new` (as configured, against `old`, the configuration applied last) with the
    /// users read from its users file, and works out the change; nothing changes until
    /// [`PreparedReload::commit`].
    pub fn prepare_reload(
        self: &Arc<Self>,
        old: &SmbConfig,
        new: &SmbConfig,
        users: Users,
    ) -> Result<PreparedReload, ReloadRefused> {
        if let Some(key) = not_live(old, new) {
            return Err(ReloadRefused::NotLive { key });
        }
        let fresh = crate::build_shares(new)?;
        let running = self.shares();
        let mut shares = Vec::with_capacity(fresh.len());
        let mut changes = Vec::new();
        let mut retired = Vec::new();
        for share in fresh {
            let before = running
                .iter()
                .find(|s| s.name.eq_ignore_ascii_case(&share.name));
            match before {
                Some(b)
                    if b.root == share.root
                        && b.read_only == share.read_only
                        && b.users == share.users
                        && b.name == share.name =>
                {
                    shares.push(b.clone());
                }
                Some(b) => {
                    changes.push(format!(
                        "SMB share {} changed ({}): its tree connects start again",
                        share.name,
                        describe(&share)
                    ));
                    retired.push(b.clone());
                    shares.push(share);
                }
                None => {
                    changes.push(format!(
                        "SMB share {} added ({})",
                        share.name,
                        describe(&share)
                    ));
                    shares.push(share);
                }
            }
        }
        for b in running.iter() {
            if !shares.iter().any(|s| s.name.eq_ignore_ascii_case(&b.name)) {
                changes.push(format!("SMB share {} removed", b.name));
                retired.push(b.clone());
            }
        }
        let users_now = self.users();
        let users = if *users_now == users {
            users_now
        } else {
            changes.push(users_change(&users_now, &users));
            Arc::new(users)
        };
        Ok(PreparedReload {
            server: self.clone(),
            shares,
            users,
            retired,
            changes,
        })
    }
}

fn describe(s: &Share) -> String {
    let users = if s.users.is_empty() {
        "every user".to_string()
    } else {
        s.users.join(", ")
    };
    let mode = if s.read_only {
        "read-only"
    } else {
        "read-write"
    };
    format!("{}, {mode}, {users}", s.root.display())
}

/// "SMB users: 3 (added carol; removed bob; new password alice)".
fn users_change(old: &Users, new: &Users) -> String {
    let a: BTreeSet<&str> = old.names().collect();
    let b: BTreeSet<&str> = new.names().collect();
    let mut parts = Vec::new();
    let added: Vec<&str> = b.difference(&a).copied().collect();
    let removed: Vec<&str> = a.difference(&b).copied().collect();
    let changed: Vec<&str> = a
        .intersection(&b)
        .copied()
        .filter(|n| old.get(n) != new.get(n))
        .collect();
    for (what, list) in [
        ("added", added),
        ("removed", removed),
        ("new password", changed),
    ] {
        if !list.is_empty() {
            parts.push(format!("{what} {}", list.join(", ")));
        }
    }
    format!("SMB users: {} ({})", new.len(), parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ShareConfig;
    use std::path::Path;

    fn config(dir: &Path, shares: &[(&str, bool)]) -> SmbConfig {
        let mut c = SmbConfig::new(dir);
        for (name, read_only) in shares {
            std::fs::create_dir_all(dir.join(name)).unwrap();
            c.shares.push(ShareConfig {
                name: name.to_string(),
                path: dir.join(name),
                read_only: *read_only,
                users: Vec::new(),
            });
        }
        c
    }

    fn users(list: &[(&str, &str)]) -> Users {
        let mut u = Users::new();
        for (n, p) in list {
            u.insert_password(n, p);
        }
        u
    }

    #[test]
    fn unchanged_shares_are_kept_changed_and_removed_ones_retired_at_commit() {
        let dir = tempfile::tempdir().unwrap();
        let old = config(dir.path(), &[("a", false), ("b", false), ("c", false)]);
        let server = Arc::new(Server::new(
            old.clone(),
            crate::build_shares(&old).unwrap(),
            users(&[("carol", "x"), ("bob", "y")]),
        ));
        let before = server.shares();
        let new = config(dir.path(), &[("a", false), ("b", true), ("d", false)]);
        let prepared = server
            .prepare_reload(&old, &new, users(&[("carol", "z"), ("dave", "w")]))
            .unwrap();
        let changes = prepared.changes().join("\n");
        assert!(changes.contains("SMB share b changed"), "{changes}");
        assert!(changes.contains("read-only"), "{changes}");
        assert!(changes.contains("SMB share d added"), "{changes}");
        assert!(changes.contains("SMB share c removed"), "{changes}");
        assert!(!changes.contains("share a"), "{changes}");
        assert!(
            changes.contains("SMB users: 2 (added dave; removed bob; new password carol)"),
            "{changes}"
        );
        // Nothing changes before the commit.
        assert!(server.share("c").is_some());
        assert!(server.share("d").is_none());
        assert!(before.iter().all(|s| !s.is_retired()));
        prepared.commit();
        assert!(server.share("c").is_none());
        assert!(server.share("d").is_some());
        assert!(server.share("b").unwrap().read_only);
        let retired: Vec<&str> = before
            .iter()
            .filter(|s| s.is_retired())
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(retired, ["b", "c"]);
        assert!(
            Arc::ptr_eq(&server.share("a").unwrap(), &before[0]),
            "a kept as is"
        );
        assert!(server.users().contains("dave") && !server.users().contains("bob"));
    }

    #[test]
    fn settings_that_need_a_restart_are_refused_with_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let old = config(dir.path(), &[("a", false)]);
        let server = Arc::new(Server::new(
            old.clone(),
            crate::build_shares(&old).unwrap(),
            Users::new(),
        ));
        type Change = fn(&mut SmbConfig);
        let cases: [(&str, Change); 6] = [
            ("smb.listen", |c| {
                c.listen = vec!["127.0.0.1:1445".parse().unwrap()]
            }),
            ("smb.signing-required", |c| {
                c.signing_required = !c.signing_required
            }),
            ("smb.server-name", |c| c.server_name = "OTHER".into()),
            ("smb.link-speed", |c| c.link_speed = Some(1)),
            ("smb.rss", |c| c.rss = !c.rss),
            ("smb.min-dialect", |c| c.min_dialect = 0x0311),
        ];
        for (key, change) in cases {
            let mut new = old.clone();
            change(&mut new);
            let err = server
                .prepare_reload(&old, &new, Users::new())
                .err()
                .expect("refused");
            assert!(err.to_string().starts_with(key), "{key}: {err}");
        }
        // A share whose directory is missing: refused, nothing changed.
        let mut new = old.clone();
        new.shares[0].path = dir.path().join("missing");
        assert!(server.prepare_reload(&old, &new, Users::new()).is_err());
        assert!(!server.share("a").unwrap().is_retired());
    }
}
