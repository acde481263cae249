//! Full-feature Text Requests (RFC 7143 11.10, appendix C): SendTargets discovery, answered
//! with every portal of every target this initiator may see; other keys get their RFC answer.

use crate::config::AclRule;
use crate::connection::Connection;
use crate::server::Server;
use crate::session::Session;
use bytes::Bytes;
use iscsi_proto::pdu::TextRequest;
use iscsi_proto::text::{self, TextBuilder};
use std::net::SocketAddr;
use std::sync::Arc;

/// Answers one Text Request on `conn`.
pub fn handle(conn: &mut Connection, req: TextRequest) {
    conn.text_request(req);
}

fn format_address(addr: SocketAddr, tpgt: u16) -> String {
    match addr {
        SocketAddr::V4(a) => format!("{}:{},{tpgt}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("[{}]:{},{tpgt}", a.ip(), a.port()),
    }
}

/// The text answer to the keys in `data`.
pub fn answer(server: &Server, session: &Arc<Session>, local: SocketAddr, data: &[u8]) -> Bytes {
    let mut out = TextBuilder::new();
    let Ok(pairs) = text::parse(data) else {
        return out.finish();
    };
    let peer_ip = session
        .connections
        .lock()
        .first()
        .map(|c| c.peer.ip())
        .unwrap_or(local.ip());
    for (key, value) in pairs {
        if key != "SendTargets" {
            // After login, operational keys cannot be renegotiated here (RFC 7143 13).
            out.push(key, if key.starts_with("X-") || key.starts_with("X#") { "NotUnderstood" } else { "Irrelevant" });
            continue;
        }
        let current = session.target.as_ref().map(|t| t.config.name.clone());
        for target in &server.targets {
            let name = &target.config.name;
            let wanted = match value {
                "All" => true,
                "" => current.as_deref() == Some(name.as_str()),
                other => other == name,
            };
            if !wanted || !AclRule::allows(&target.config.acl, &session.initiator_name, peer_ip) {
                continue;
            }
            out.push("TargetName", name);
            for group in &server.config.portal_groups {
                if !target.on_portal_group(group.tag) {
                    continue;
                }
                for addr in crate::portals::reportable(&server.portals, group.tag, local) {
                    out.push("TargetAddress", &format_address(addr, group.tag));
                }
            }
        }
    }
    out.finish()
}
