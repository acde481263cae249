//! What SendTargets may tell an initiator: every target its ACLs let it see, each with every
//! portal of every portal group it is exported on (RFC 7143 appendix C). The key handling
//! itself is `iscsi_proto::text_exchange`.

use crate::config::AclRule;
use crate::connection::Connection;
use crate::server::Server;
use crate::session::Session;
use iscsi_proto::pdu::TextRequest;
use iscsi_proto::text_exchange::TargetPortals;
use std::net::SocketAddr;
use std::sync::Arc;

/// Answers one Text Request on `conn`.
pub fn handle(conn: &mut Connection, req: TextRequest) {
    conn.text_request(req);
}

/// The targets `session`'s initiator may see, with their portals as reachable from `local`.
pub fn visible_targets(
    server: &Server,
    session: &Arc<Session>,
    local: SocketAddr,
) -> Vec<TargetPortals> {
    let peer_ip = session
        .connections
        .lock()
        .first()
        .map(|c| c.peer.ip())
        .unwrap_or(local.ip());
    let config = server.config();
    server
        .targets
        .iter()
        .filter(|t| AclRule::allows(&t.config().acl, &session.initiator_name, peer_ip))
        .map(|t| {
            let reported = server.portals.read();
            let portals = config
                .portal_groups
                .iter()
                .filter(|g| t.on_portal_group(g.tag))
                .flat_map(|g| {
                    crate::portals::reportable(&reported, g.tag, local)
                        .into_iter()
                        .map(move |a| (a, g.tag))
                })
                .collect();
            (t.name.clone(), portals)
        })
        .collect()
}
