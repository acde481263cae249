//! Runs SCSI commands on the blocking pool (file I/O) and hands their results to the writer.

use crate::pool::BufferPool;
use crate::send_queue::OutSender;
use crate::session::Session;
use crate::writer::{DataInPart, Outbound, ScsiDone};
use bytes::{Bytes, BytesMut};
use iscsi_proto::pdu::{task_attr, ScsiCommand};
use std::sync::Arc;

fn attribute(attr: u8) -> scsi::TaskAttribute {
    match attr {
        task_attr::ORDERED => scsi::TaskAttribute::Ordered,
        task_attr::HEAD_OF_QUEUE => scsi::TaskAttribute::HeadOfQueue,
        task_attr::ACA => scsi::TaskAttribute::Aca,
        _ => scsi::TaskAttribute::Simple,
    }
}

/// Hands a streamed READ's pieces to the connection's writer while the task lives.
struct PartSink {
    session: Arc<Session>,
    out: OutSender,
    pool: Arc<BufferPool>,
    itt: u32,
    lun: u64,
}

impl scsi::aio::ReadSink for PartSink {
    fn buffer(&mut self, len: usize) -> BytesMut {
        self.pool.get(len)
    }

    fn part(&mut self, offset: usize, data: Bytes) -> bool {
        let Ok(offset) = u32::try_from(offset) else {
            return false;
        };
        let (itt, lun, out) = (self.itt, self.lun, &self.out);
        self.session.while_live(itt, || {
            let _ = out.send(Outbound::DataInPart(DataInPart {
                itt,
                lun,
                offset,
                data,
            }));
        })
    }
}

/// Executes `cmd` with its data-out `segments` and queues the response, unless the task is
/// aborted meanwhile (then no response is sent: task management answers for it).
///
/// READs and WRITEs of a device with asynchronous I/O (an RBD image) are submitted here and
/// ended by a task when the storage completes them (`submit`). READs served from the page
/// cache and buffered WRITEs the device takes without sleeping (RWF_NOWAIT) run right here on
/// the connection's task (`execute_nowait`); other buffered
/// WRITEs run on the write lanes ([`crate::write_lanes`]); everything else runs on the
/// blocking pool. A READ of such a device longer than `read_piece` bytes is read in pieces of
/// that size, each sent as soon as it and those before it are read.
#[allow(clippy::too_many_arguments)]
pub fn spawn(
    session: Arc<Session>,
    out: OutSender,
    pool: &Arc<BufferPool>,
    luns: Option<&Arc<scsi::LunMap>>,
    cmd: ScsiCommand,
    segments: Vec<Bytes>,
    (received, r2t_count): (u32, u32),
    read_piece: usize,
) {
    if let (Some(luns), None) = (luns, &cmd.extended_cdb) {
        let lun = crate::tmf::lun_number(cmd.lun);
        let mut data_in = pool.get(data_in_size(&cmd));
        let req = request(&session, &cmd, lun, &cmd.cdb, &segments);
        // Storage with asynchronous I/O (RBD): submitted here, ended by a task when the
        // storage completes it; no thread waits for it.
        // Only a READ longer than a piece can be streamed: no sink for the others.
        let long = cmd.expected_data_length as usize > read_piece;
        let stream = (cmd.read && read_piece > 0 && long).then(|| scsi::aio::Streamed {
            piece: read_piece,
            sink: Box::new(PartSink {
                session: session.clone(),
                out: out.clone(),
                pool: pool.clone(),
                itt: cmd.itt,
                lun: cmd.lun,
            }),
        });
        data_in = match luns.submit(&req, data_in, stream) {
            Ok(submitted) => {
                let luns = luns.clone();
                tokio::spawn(async move {
                    let ended = submitted.await;
                    let done = Finished {
                        lun,
                        cdb: &cmd.cdb,
                        outcome: ended.outcome,
                        data_in: ended.data_in,
                        data_offset: u32::try_from(ended.handed).unwrap_or(u32::MAX),
                        received,
                        r2t_count,
                    };
                    respond(&session, &out, &luns, &cmd, done);
                });
                return;
            }
            Err(data_in) => data_in,
        };
        if let Some(outcome) = luns.execute_nowait(&req, &mut data_in) {
            let done = Finished {
                lun,
                cdb: &cmd.cdb,
                outcome,
                data_in,
                data_offset: 0,
                received,
                r2t_count,
            };
            respond(&session, &out, luns, &cmd, done);
            return;
        }
        pool.put(data_in.freeze());
    }
    let pool = pool.clone();
    let buffered_write = cmd.extended_cdb.is_none()
        && luns.is_some_and(|l| l.is_buffered_write(crate::tmf::lun_number(cmd.lun), &cmd.cdb));
    // The map the command was routed with: a LUN removed by a reload meanwhile still ends
    // its command cleanly on the logical unit it started on.
    let luns = luns.cloned();
    let job = move || {
        let Some(luns) = luns else {
            session.task_done(cmd.itt);
            return;
        };
        let cdb_owned;
        let cdb: &[u8] = match &cmd.extended_cdb {
            Some(ext) => {
                let mut v = Vec::with_capacity(16 + ext.len());
                v.extend_from_slice(&cmd.cdb);
                v.extend_from_slice(ext);
                cdb_owned = v;
                &cdb_owned
            }
            None => &cmd.cdb,
        };
        let mut data_in = pool.get(data_in_size(&cmd));
        let lun = crate::tmf::lun_number(cmd.lun);
        let req = request(&session, &cmd, lun, cdb, &segments);
        let outcome = luns.execute(&req, &mut data_in);
        let done = Finished {
            lun,
            cdb,
            outcome,
            data_in,
            data_offset: 0,
            received,
            r2t_count,
        };
        respond(&session, &out, &luns, &cmd, done);
    };
    if buffered_write {
        crate::write_lanes::run(job);
    } else {
        tokio::task::spawn_blocking(job);
    }
}

/// Room to reserve for a command's data-in: what the initiator expects (READ) or a small
/// default for parameter data (INQUIRY, MODE SENSE...).
fn data_in_size(cmd: &ScsiCommand) -> usize {
    if cmd.read {
        (cmd.expected_data_length as usize).min(16 << 20)
    } else {
        0
    }
}

fn request<'a>(
    session: &'a Session,
    cmd: &ScsiCommand,
    lun: u64,
    cdb: &'a [u8],
    segments: &'a [Bytes],
) -> scsi::ScsiRequest<'a> {
    scsi::ScsiRequest {
        nexus: &session.nexus,
        lun,
        cdb,
        data_out: segments,
        data_in_limit: cmd.expected_data_length,
        attr: attribute(cmd.attr),
    }
}

/// A command the logical unit has finished, with what its data-out phase delivered.
struct Finished<'a> {
    lun: u64,
    cdb: &'a [u8],
    outcome: scsi::ScsiOutcome,
    data_in: BytesMut,
    /// Bytes of data-in already sent as parts (a streamed READ).
    data_offset: u32,
    received: u32,
    r2t_count: u32,
}

/// Queues the response of a finished command (unless it was aborted meanwhile).
fn respond(
    session: &Session,
    out: &OutSender,
    luns: &scsi::LunMap,
    cmd: &ScsiCommand,
    f: Finished<'_>,
) {
    let write_expected = cmd
        .write
        .then(|| data_out_length(luns, f.lun, f.cdb))
        .flatten();
    let sense = f
        .outcome
        .sense
        .map(|s| Bytes::copy_from_slice(&s.to_fixed_bytes()));
    let done = ScsiDone {
        itt: cmd.itt,
        lun: cmd.lun,
        status: f.outcome.status,
        sense,
        data_in: f.data_in.freeze(),
        data_offset: f.data_offset,
        edtl: cmd.expected_data_length,
        read: cmd.read,
        write: cmd.write,
        write_expected,
        write_received: f.received,
        r2t_count: f.r2t_count,
    };
    session.finish_task(cmd.itt, |aborted| {
        let done = if aborted { aborted_done(cmd) } else { done };
        let _ = out.send(Outbound::Scsi(done));
    });
}

/// The answer to a task that task management from another I_T nexus aborted: TASK ABORTED,
/// no data, no sense (SAM-5 5.6, the control mode page's TAS bit).
fn aborted_done(cmd: &ScsiCommand) -> ScsiDone {
    unexecuted_done(cmd, scsi::status::TASK_ABORTED, None)
}

/// The answer to a command that never ran: `status` (and `sense`), no data.
fn unexecuted_done(cmd: &ScsiCommand, status: u8, sense: Option<Bytes>) -> ScsiDone {
    ScsiDone {
        itt: cmd.itt,
        lun: cmd.lun,
        status,
        sense,
        data_in: Bytes::new(),
        data_offset: 0,
        edtl: cmd.expected_data_length,
        read: cmd.read,
        write: cmd.write,
        write_expected: None,
        write_received: 0,
        r2t_count: 0,
    }
}

/// Ends `cmd`, aborted by another nexus's task management before it ran, with TASK ABORTED.
pub fn aborted(session: &Session, out: &OutSender, cmd: &ScsiCommand) {
    session.finish_task(cmd.itt, |_| {
        let _ = out.send(Outbound::Scsi(aborted_done(cmd)));
    });
}

/// Ends `cmd` with CHECK CONDITION and `sense` without executing it.
pub fn fail(session: &Arc<Session>, out: &OutSender, cmd: &ScsiCommand, sense: Bytes) {
    let done = unexecuted_done(cmd, scsi::status::CHECK_CONDITION, Some(sense));
    session.finish_task(cmd.itt, |aborted| {
        let done = if aborted { aborted_done(cmd) } else { done };
        let _ = out.send(Outbound::Scsi(done));
    });
}

/// Bytes of data-out the CDB calls for, for residual accounting (RFC 7143 11.4.5); `None`
/// when the CDB cannot be decoded or the LUN does not exist.
pub fn data_out_length(luns: &scsi::LunMap, lun: u64, cdb: &[u8]) -> Option<u32> {
    use scsi::Command as C;
    let bs = luns.get(lun)?.config().block_size;
    let blocks = |n: u32| n.checked_mul(bs);
    match scsi::decode_cdb(cdb).ok()? {
        C::Write(r) | C::WriteAndVerify { range: r, .. } => blocks(r.blocks),
        C::Verify { range, bytchk: 1 } => blocks(range.blocks),
        C::Verify { bytchk: 3, .. } => Some(bs),
        C::Verify { .. } => Some(0),
        C::WriteSame { ndob: false, .. } => Some(bs),
        C::CompareAndWrite(r) => blocks(r.blocks)?.checked_mul(2),
        C::Unmap { param_len, .. }
        | C::ModeSelect { param_len, .. }
        | C::PersistentReserveOut { param_len, .. }
        | C::SetTargetPortGroups { param_len }
        | C::ExtendedCopy { param_len } => Some(param_len),
        _ => Some(0),
    }
}
