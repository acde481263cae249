//! The login phase of a connection: feeds Login Requests to the sans-IO `TargetLogin` and
//! answers the policy questions (targets, ACLs, CHAP secrets, session table) it asks.

use crate::config::AclRule;
use crate::server::{Portal, Server};
use crate::session::Session;
use iscsi_proto::login::{ChapCredentials, LoginOutcome, LoginPolicy, LoginRefusal};
use iscsi_proto::negotiation::SessionType;
use rand::RngCore;
use std::net::SocketAddr;
use std::sync::Arc;

/// Answers `TargetLogin`'s questions for one connection.
pub struct ConnectionPolicy {
    pub server: Arc<Server>,
    pub portal: Portal,
    pub peer: SocketAddr,
    /// CmdSN of the latest Login Request: the session's first ExpCmdSN.
    pub cmd_sn: u32,
    /// Set by `admit`: the session this connection belongs to.
    pub session: Option<Arc<Session>>,
    /// A session ended by reinstatement, whose tasks must drain before the login completes.
    pub reinstated: Option<Arc<Session>>,
    /// Sessions of the same initiator, ISID and target that an earlier reinstatement ended,
    /// whose tasks were still running at this login: they too drain before it completes.
    pub still_ending: Vec<Arc<Session>>,
    /// The target configuration the login was authorized (and its CHAP checked) against.
    pub authorized_with: Option<Arc<crate::config::TargetConfig>>,
}

fn credentials(chap: &crate::config::ChapConfig) -> ChapCredentials {
    ChapCredentials {
        user: chap.user.clone(),
        secret: chap.secret.expose().to_vec(),
        mutual: match (&chap.mutual_user, &chap.mutual_secret) {
            (Some(u), Some(s)) => Some((u.clone(), s.expose().to_vec())),
            _ => None,
        },
        algorithms: chap.algorithms.iter().map(|a| a.number()).collect(),
    }
}

impl LoginPolicy for ConnectionPolicy {
    fn portal_group_tag(&self) -> u16 {
        self.portal.tpgt
    }

    fn authorize(
        &mut self,
        initiator_name: &str,
        target_name: &str,
    ) -> Result<Option<ChapCredentials>, LoginRefusal> {
        let Some(target) = self.server.target(target_name) else {
            return Err(LoginRefusal::NotFound);
        };
        if !target.on_portal_group(self.portal.tpgt) {
            return Err(LoginRefusal::NotFound);
        }
        let config = target.config();
        if !AclRule::allows(&config.acl, initiator_name, self.peer.ip()) {
            return Err(LoginRefusal::AuthorizationFailure);
        }
        let chap = config.chap.as_ref().map(credentials);
        self.authorized_with = Some(config);
        Ok(chap)
    }

    fn discovery_auth(
        &mut self,
        _initiator_name: &str,
    ) -> Result<Option<ChapCredentials>, LoginRefusal> {
        Ok(self
            .server
            .config()
            .discovery_auth
            .as_ref()
            .map(credentials))
    }

    fn admit(&mut self, login: &LoginOutcome) -> Result<u16, LoginRefusal> {
        if login.tsih != 0 {
            return self.add_connection(login);
        }
        let target = match login.session.session_type {
            SessionType::Discovery => None,
            SessionType::Normal => {
                let name = login.session.target_name.as_deref().unwrap_or_default();
                Some(
                    self.server
                        .target(name)
                        .cloned()
                        .ok_or(LoginRefusal::NotFound)?,
                )
            }
        };
        let initiator = login.session.initiator_name.as_str();
        let mut table = self.server.sessions.lock();
        if let Some(t) = &target {
            // A reload may have changed the ACL or CHAP since `authorize`. It replaces the
            // configuration before it scans the session table, and this check and the insert
            // below hold the table's lock: either the reload sees this session, or this
            // login sees the new configuration.
            let now = t.config();
            if !AclRule::allows(&now.acl, initiator, self.peer.ip()) {
                return Err(LoginRefusal::AuthorizationFailure);
            }
            if self.authorized_with.as_ref().map(|c| &c.chap) != Some(&now.chap) {
                return Err(LoginRefusal::AuthenticationFailed);
            }
        }
        let target_name = target.as_ref().map(|t| t.name.as_str());
        // RFC 7143 6.3.5: a leading login with an ISID in use reinstates that session.
        self.still_ending = table.still_ending(initiator, login.isid, target_name);
        if let Some(old) = table.find(initiator, login.isid, target_name) {
            table.by_tsih.remove(&old.tsih);
            old.close_all();
            table.ending.push(old.clone());
            self.reinstated = Some(old);
        }
        if let Some(t) = &target {
            if !t.config().allow_multiple_sessions {
                let other = table.by_tsih.values().any(|s| {
                    &*s.initiator_name == initiator
                        && s.target.as_ref().is_some_and(|x| Arc::ptr_eq(x, t))
                });
                if other {
                    return Err(LoginRefusal::TooManyConnections);
                }
            }
        }
        crate::limits::check_sessions(&self.server.limits, &table, initiator, self.peer)?;
        let tsih = table.allocate_tsih().ok_or(LoginRefusal::OutOfResources)?;
        let nexus = scsi::Nexus {
            id: self.server.next_nexus_id(),
            initiator_name: Arc::from(initiator),
            isid: login.isid,
            relative_target_port: self.portal.tpgt,
            target_port_group: self.portal.tpgt,
        };
        let session = Arc::new(Session::new(
            tsih,
            login.isid,
            Arc::from(initiator),
            login.session.clone(),
            target,
            nexus,
            self.portal.tpgt,
            self.cmd_sn,
            self.server.limits.config.commands_per_session,
        ));
        if let Some(t) = &session.target {
            // Under the session table lock: a reload adding a LUN sees this session, or this
            // login sees the reloaded LUN map.
            t.luns.load().nexus_added(&session.nexus);
        }
        table.by_tsih.insert(tsih, session.clone());
        self.session = Some(session);
        Ok(tsih)
    }

    fn fill_random(&mut self, buf: &mut [u8]) {
        rand::thread_rng().fill_bytes(buf);
    }
}

impl ConnectionPolicy {
    /// A non-leading login (MC/S): joins the session named by TSIH (RFC 7143 6.3.1).
    fn add_connection(&mut self, login: &LoginOutcome) -> Result<u16, LoginRefusal> {
        let table = self.server.sessions.lock();
        let session = table
            .by_tsih
            .get(&login.tsih)
            .filter(|s| s.isid == login.isid && *s.initiator_name == *login.session.initiator_name)
            .cloned()
            .ok_or(LoginRefusal::SessionDoesNotExist)?;
        drop(table);
        if session.tpgt != self.portal.tpgt {
            // RFC 7143 4.4.1: all connections of a session use one portal group.
            return Err(LoginRefusal::CannotIncludeInSession);
        }
        let conns = session.connections.lock();
        if let Some(old) = conns.iter().find(|c| c.cid == login.cid) {
            // Connection reinstatement: the old connection with this CID ends.
            old.close.cancel();
        } else if conns.len() >= usize::from(session.params.max_connections.max(1)) {
            return Err(LoginRefusal::TooManyConnections);
        }
        drop(conns);
        self.session = Some(session);
        Ok(login.tsih)
    }
}
