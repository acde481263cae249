//! Task management (RFC 7143 11.5, SAM-5 7): aborts, resets, and their unit attentions.

use crate::send_queue::OutSender;
use crate::server::Server;
use crate::session::Session;
use crate::writer::Outbound;
use iscsi_proto::pdu::{tmf, tmf_response, Pdu, TaskMgmtRequest, TaskMgmtResponse};
use iscsi_proto::serial;
use std::collections::HashSet;
use std::sync::Arc;
use tracing::info;

/// LUN number from the 8-byte SAM LUN field (peripheral and flat addressing, SAM-5 4.7).
pub fn lun_number(raw: u64) -> u64 {
    (raw >> 48) & 0x3fff
}

/// Every session logged into the same target as `session` (including it).
fn sessions_of_target(server: &Server, session: &Arc<Session>) -> Vec<Arc<Session>> {
    match &session.target {
        Some(target) => server.sessions_of(target),
        None => vec![session.clone()],
    }
}

/// Answers one task management request; waits (in a task of its own) for aborted commands to
/// finish so that no response of an aborted task follows the TMF response.
pub fn handle(server: &Arc<Server>, session: &Arc<Session>, out: &OutSender, req: TaskMgmtRequest) {
    let respond = {
        let out = out.clone();
        let itt = req.itt;
        move |response: u8| {
            let _ = out.send(Outbound::Pdu(Pdu::TaskMgmtResponse(TaskMgmtResponse {
                response,
                itt,
                ..TaskMgmtResponse::default()
            })));
        }
    };
    let Some(target) = session.target.clone() else {
        respond(tmf_response::NOT_SUPPORTED);
        return;
    };
    let function = req.function & 0x7f;
    let lun = lun_number(req.lun);
    let luns = target.luns.load();
    let lun_exists = luns.get(lun).is_some();
    info!(
        initiator = %session.initiator_name,
        tsih = session.tsih,
        function,
        lun,
        "task management"
    );
    // Which tasks of which sessions end, and what happens to the logical units.
    let mut waits: Vec<(Arc<Session>, HashSet<u32>)> = Vec::new();
    let mut collect = |s: &Arc<Session>, pred: &dyn Fn(u32, &crate::session::TaskEntry) -> bool| {
        let set: HashSet<u32> = s
            .abort_where(!Arc::ptr_eq(s, session), |itt, t| {
                itt != req.itt && pred(itt, t)
            })
            .into_iter()
            .collect();
        if !set.is_empty() {
            waits.push((s.clone(), set));
        }
    };
    // Resets reach the nexuses (and release the SPC-2 reservation) of an HA pair's other node
    // too, before the answer, off the event loop: they wait for the peer.
    let mut share_reset: Option<Arc<scsi::LogicalUnit>> = None;
    let mut share_target_reset: Option<(Arc<scsi::LunMap>, bool)> = None;
    let response = match function {
        tmf::ABORT_TASK => {
            let rtt = req.referenced_task_tag;
            let exists = session.tasks.lock().contains_key(&rtt);
            if exists {
                collect(session, &|itt, _| itt == rtt);
                tmf_response::COMPLETE
            } else if serial::le(session.exp_cmd_sn(), req.ref_cmd_sn)
                && serial::lt(req.ref_cmd_sn, req.cmd_sn)
            {
                // RFC 7143 11.5.1 b): the referenced command has not arrived (a CmdSN hole in
                // the window); it is considered received and ended.
                tmf_response::COMPLETE
            } else {
                tmf_response::TASK_DOES_NOT_EXIST
            }
        }
        tmf::ABORT_TASK_SET | tmf::CLEAR_TASK_SET if !lun_exists => {
            tmf_response::LUN_DOES_NOT_EXIST
        }
        tmf::ABORT_TASK_SET => {
            collect(session, &|_, t| lun_number(t.lun) == lun);
            tmf_response::COMPLETE
        }
        tmf::CLEAR_TASK_SET => {
            for s in sessions_of_target(server, session) {
                collect(&s, &|_, t| lun_number(t.lun) == lun);
            }
            luns.clear_task_set(lun, &session.nexus);
            tmf_response::COMPLETE
        }
        tmf::LOGICAL_UNIT_RESET if !lun_exists => tmf_response::LUN_DOES_NOT_EXIST,
        tmf::LOGICAL_UNIT_RESET => {
            for s in sessions_of_target(server, session) {
                collect(&s, &|_, t| lun_number(t.lun) == lun);
            }
            // SAM-5 6.3: a logical unit reset raises 29/03 on every I_T nexus, the one that
            // asked included (libiscsi's MultipathIO.Reset checks every path).
            if let Some(lu) = luns.get(lun) {
                lu.lun_reset(None);
                share_reset = Some(lu.clone());
            }
            tmf_response::COMPLETE
        }
        tmf::TARGET_WARM_RESET | tmf::TARGET_COLD_RESET => {
            for s in sessions_of_target(server, session) {
                collect(&s, &|_, _| true);
            }
            luns.target_reset(function == tmf::TARGET_COLD_RESET);
            share_target_reset = Some((luns.clone(), function == tmf::TARGET_COLD_RESET));
            tmf_response::COMPLETE
        }
        tmf::CLEAR_ACA => tmf_response::NOT_SUPPORTED,
        tmf::TASK_REASSIGN => tmf_response::REASSIGNMENT_NOT_SUPPORTED,
        _ => tmf_response::REJECTED,
    };
    let cold = function == tmf::TARGET_COLD_RESET && response == tmf_response::COMPLETE;
    let server = server.clone();
    let session = session.clone();
    tokio::spawn(async move {
        for (s, set) in waits {
            s.wait_until(|tasks| !tasks.keys().any(|k| set.contains(k)))
                .await;
        }
        if let Some(lu) = share_reset {
            let _ = tokio::task::spawn_blocking(move || lu.share_lun_reset()).await;
        }
        if let Some((luns, cold)) = share_target_reset {
            let _ = tokio::task::spawn_blocking(move || luns.share_target_reset(cold)).await;
        }
        respond(response);
        if cold {
            // SAM-5 5.12: a cold reset ends every I_T nexus of the target.
            for s in sessions_of_target(&server, &session) {
                s.close_all();
            }
        }
    });
}
