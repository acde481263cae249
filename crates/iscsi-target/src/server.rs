//! The running server: targets, the session table, portals, and the accept loops.

use crate::config::ServeConfig;
use crate::listen::Listener;
use crate::reload::ConfigSource;
use crate::session::Session;
use crate::target::TargetRuntime;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// A listening address and the portal group (TPGT) it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Portal {
    pub tpgt: u16,
    pub addr: SocketAddr,
}

/// Sessions by TSIH; only touched at login, logout and connection loss.
#[derive(Default)]
pub struct SessionTable {
    pub by_tsih: HashMap<u16, Arc<Session>>,
    /// Sessions ended by reinstatement whose tasks may still be running. A later leading
    /// login with the same initiator, ISID and target waits for them as well, so the fence
    /// holds when the login that reinstated them was given up by its initiator before they
    /// ended (RFC 7143 6.3.5: no new session's command before the old session's tasks end).
    pub ending: Vec<Arc<Session>>,
    next_tsih: u16,
}

impl SessionTable {
    /// A TSIH not in use; never 0 (RFC 7143 11.12.6: 0 is reserved for a leading login).
    pub fn allocate_tsih(&mut self) -> Option<u16> {
        for _ in 0..=u16::MAX {
            self.next_tsih = self.next_tsih.wrapping_add(1);
            if self.next_tsih != 0 && !self.by_tsih.contains_key(&self.next_tsih) {
                return Some(self.next_tsih);
            }
        }
        None
    }

    /// The sessions of `initiator` + `isid` to `target` that reinstatement ended and whose
    /// tasks still run; those whose tasks have all ended are forgotten.
    pub fn still_ending(
        &mut self,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
    ) -> Vec<Arc<Session>> {
        self.ending.retain(|s| s.tasks_in_flight() > 0);
        self.ending
            .iter()
            .filter(|s| same_nexus(s, initiator, isid, target))
            .cloned()
            .collect()
    }

    /// The session of `initiator` + `isid` to `target` (None = discovery), if any.
    pub fn find(
        &self,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
    ) -> Option<Arc<Session>> {
        self.by_tsih
            .values()
            .find(|s| same_nexus(s, initiator, isid, target))
            .cloned()
    }
}

fn same_nexus(s: &Session, initiator: &str, isid: [u8; 6], target: Option<&str>) -> bool {
    &*s.initiator_name == initiator
        && s.isid == isid
        && s.target.as_ref().map(|t| t.name.as_str()) == target
}

/// Shared state of `lanes serve`.
pub struct Server {
    /// The configuration running now; a reload replaces it as a whole.
    running: RwLock<Arc<ServeConfig>>,
    /// Where a reload reads the configuration from.
    pub source: ConfigSource,
    /// Held for the whole of a reload, so two reloads never interleave.
    pub reload_lock: tokio::sync::Mutex<()>,
    pub targets: Vec<Arc<TargetRuntime>>,
    /// The bound portals (wildcards as bound), for SendTargets.
    pub portals: RwLock<Vec<Portal>>,
    /// The listening portals, each with the handle that stops it.
    pub listeners: Mutex<Vec<Listener>>,
    pub sessions: Mutex<SessionTable>,
    pub limits: crate::limits::Limits,
    next_nexus: AtomicU64,
    pub shutdown: CancellationToken,
    /// Other services of the process that report through the status socket and `/metrics`.
    pub sections: Vec<Arc<dyn crate::status::StatusSection>>,
    /// Other services of the process that a reload reconfigures too.
    pub reload_sections: Mutex<Vec<Arc<dyn crate::reload::ReloadSection>>>,
}

impl Server {
    pub fn new(
        config: ServeConfig,
        source: ConfigSource,
        targets: Vec<Arc<TargetRuntime>>,
    ) -> Self {
        Server {
            limits: crate::limits::Limits::new(config.limits.clone()),
            running: RwLock::new(Arc::new(config)),
            source,
            reload_lock: tokio::sync::Mutex::new(()),
            targets,
            portals: RwLock::new(Vec::new()),
            listeners: Mutex::new(Vec::new()),
            sessions: Mutex::new(SessionTable::default()),
            next_nexus: AtomicU64::new(1),
            shutdown: CancellationToken::new(),
            sections: Vec::new(),
            reload_sections: Mutex::new(Vec::new()),
        }
    }

    /// Adds the status sections of other services.
    pub fn with_sections(mut self, sections: Vec<Arc<dyn crate::status::StatusSection>>) -> Self {
        self.sections = sections;
        self
    }

    /// The running configuration.
    pub fn config(&self) -> Arc<ServeConfig> {
        self.running.read().clone()
    }

    /// Replaces the running configuration (the last step of a reload).
    pub fn set_config(&self, config: Arc<ServeConfig>) {
        *self.running.write() = config;
    }

    /// Recomputes the bound portals from the listeners (what SendTargets answers from).
    pub fn refresh_portals(&self) {
        let bound: Vec<Portal> = self.listeners.lock().iter().map(|l| l.portal).collect();
        *self.portals.write() = bound;
    }

    /// Every session logged into `target`.
    pub fn sessions_of(&self, target: &Arc<TargetRuntime>) -> Vec<Arc<Session>> {
        self.sessions
            .lock()
            .by_tsih
            .values()
            .filter(|s| s.target.as_ref().is_some_and(|t| Arc::ptr_eq(t, target)))
            .cloned()
            .collect()
    }

    /// What logins negotiate from. Per-target values come from the first target; all targets
    /// of one server share them because operational keys may precede TargetName.
    pub fn login_defaults(&self) -> iscsi_proto::negotiation::TargetDefaults {
        use crate::config::DigestConfig;
        use iscsi_proto::negotiation::{Digest, TargetDefaults};
        let mut d = TargetDefaults {
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            ..TargetDefaults::default()
        };
        if let Some(t) = self.targets.first() {
            let c = t.config();
            let digests = |v: &[DigestConfig]| {
                v.iter()
                    .map(|d| match d {
                        DigestConfig::None => Digest::None,
                        DigestConfig::Crc32c => Digest::Crc32c,
                    })
                    .collect()
            };
            d.max_recv_data_segment_length = c.max_recv_data_segment_length;
            d.max_burst_length = c.max_burst_length;
            d.first_burst_length = c.first_burst_length;
            d.max_connections = c.max_connections;
            d.immediate_data = c.immediate_data;
            d.initial_r2t = c.initial_r2t;
            d.max_outstanding_r2t = c.max_outstanding_r2t;
            d.header_digests = digests(&c.header_digest);
            d.data_digests = digests(&c.data_digest);
            d.target_alias = c.alias.clone();
        }
        d.queue_depth = self.config().limits.commands_per_session;
        d
    }

    pub fn next_nexus_id(&self) -> u64 {
        self.next_nexus.fetch_add(1, Ordering::Relaxed)
    }

    pub fn target(&self, name: &str) -> Option<&Arc<TargetRuntime>> {
        self.targets.iter().find(|t| t.name == name)
    }

    /// Removes a session from the table (its last connection is gone, or it was logged out) and
    /// tells its logical units the I_T nexus is lost.
    pub fn remove_session(&self, session: &Arc<Session>) {
        let removed = {
            let mut table = self.sessions.lock();
            match table.by_tsih.get(&session.tsih) {
                Some(s) if Arc::ptr_eq(s, session) => table.by_tsih.remove(&session.tsih),
                _ => None,
            }
        };
        if removed.is_some() {
            if let Some(t) = &session.target {
                t.luns.nexus_lost(&session.nexus);
            }
        }
    }
}
