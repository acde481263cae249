//! The write path of a connection: Data-Out collection against the sans-IO `DataOutTracker`
//! (immediate data, the unsolicited burst, R2Ts), and execution once a write has both its
//! CmdSN turn and all its data.

use super::{header_of, next_tag, Connection};
use crate::writer::Outbound;
use bytes::Bytes;
use iscsi_proto::pdu::{reject_reason, DataOut, Pdu, R2t, ScsiCommand, RESERVED_TAG};
use iscsi_proto::window::{DataOutError, DataOutTracker, WriteParams};
use tracing::debug;

/// Largest data-out a command may announce: twice the 8 MiB block-limits transfer length, so
/// COMPARE AND WRITE fits. Larger writes are refused before any data is solicited.
const MAX_WRITE_BYTES: u32 = 16 << 20;

/// A write whose data is being collected, and its command once its CmdSN turn has come.
pub(super) struct PendingWrite {
    /// `Err`: the command's data broke the negotiated rules or limits; it ends with this sense
    /// once its CmdSN turn comes.
    pub(super) tracker: Result<DataOutTracker, scsi::Sense>,
    /// Immediate data and Data-Out segments in arrival (= offset) order; DataPDUInOrder and
    /// DataSequenceInOrder are always Yes because we offer Yes and the result function is OR.
    pub(super) segments: Vec<Bytes>,
    pub(super) command: Option<ScsiCommand>,
    pub(super) lun: u64,
}

impl Connection {
    pub(super) fn start_write(&mut self, c: &ScsiCommand) {
        let p = &self.session.params;
        let params = WriteParams {
            expected_data_length: c.expected_data_length,
            immediate_length: u32::try_from(c.data.len()).unwrap_or(u32::MAX),
            unsolicited_follows: !c.final_bit,
            initial_r2t: p.initial_r2t,
            immediate_data: p.immediate_data,
            first_burst_length: p.first_burst_length,
            max_burst_length: p.max_burst_length,
            max_outstanding_r2t: p.max_outstanding_r2t,
            max_recv_data_segment_length: self.params.max_recv_data_segment_length,
        };
        let tracker = if c.expected_data_length > MAX_WRITE_BYTES {
            // Nothing this target executes takes more; refusing before soliciting any data
            // keeps a connection's memory bounded by the negotiated limits.
            debug!(
                itt = c.itt,
                edtl = c.expected_data_length,
                "write too large"
            );
            Err(scsi::Sense::new(0x05, 0x24, 0x00))
        } else {
            DataOutTracker::new(params).map_err(|e| {
                // RFC 7143 10.4.7.2: unexpected unsolicited data.
                debug!(itt = c.itt, "write refused: {e}");
                scsi::Sense::new(0x0b, 0x0c, 0x0c)
            })
        };
        let mut segments = Vec::new();
        if tracker.is_ok() && !c.data.is_empty() {
            segments.push(c.data.clone());
        }
        let write = PendingWrite {
            tracker,
            segments,
            command: None,
            lun: c.lun,
        };
        // No R2T yet: data is solicited only once the command's CmdSN turn has come (see
        // `issue_r2ts`).
        self.writes.insert(c.itt, write);
    }

    pub(super) fn data_out(&mut self, d: &DataOut) {
        let Some(w) = self.writes.get_mut(&d.itt) else {
            // RFC 7143 11.7: Data-Out for an unknown task is a protocol error; reject it.
            let header = header_of(&Pdu::DataOut(d.clone()), &self.framer);
            self.reject(reject_reason::PROTOCOL_ERROR, &header);
            return;
        };
        let Ok(tracker) = w.tracker.as_mut() else {
            return;
        };
        match tracker.on_data_out(d) {
            Ok(_) => {
                if !d.data.is_empty() {
                    w.segments.push(d.data.clone());
                }
            }
            Err(e) => {
                // ErrorRecoveryLevel 0 (RFC 7143 7.1.4): reject the PDU and end the command
                // with an iSCSI sense rather than leave it waiting for data that cannot come.
                debug!(itt = d.itt, "Data-Out refused: {e}");
                // RFC 7143 10.4.7.2: unsolicited data beyond what FirstBurstLength and
                // InitialR2T allow is "unexpected unsolicited data" (0x0c/0x0c); any other
                // wrong amount is "incorrect amount of data" (0x0c/0x0d).
                let unexpected = d.ttt == RESERVED_TAG
                    && matches!(
                        e,
                        DataOutError::UnsolicitedNotAllowed | DataOutError::OutsideRange { .. }
                    );
                let ascq = if unexpected { 0x0c } else { 0x0d };
                w.tracker = Err(scsi::Sense::new(0x0b, 0x0c, ascq));
                w.segments.clear();
                let header = header_of(&Pdu::DataOut(d.clone()), &self.framer);
                self.reject(e.reject_reason(), &header);
                self.try_execute_write(d.itt);
                return;
            }
        }
        self.issue_r2ts(d.itt);
        self.try_execute_write(d.itt);
    }

    /// Sends the R2Ts a write may have outstanding now (MaxOutstandingR2T, RFC 7143 13.17).
    /// Only writes whose CmdSN turn has come are solicited: a peer that leaves a gap in CmdSN
    /// order cannot make the target collect data for the whole window behind it (only the
    /// unsolicited FirstBurstLength of each).
    pub(super) fn issue_r2ts(&mut self, itt: u32) {
        let Some(PendingWrite {
            tracker: Ok(tracker),
            lun,
            command: Some(_),
            ..
        }) = self.writes.get_mut(&itt)
        else {
            return;
        };
        let lun = *lun;
        let next = &mut self.next_ttt;
        let mut planned = std::mem::take(&mut self.r2ts);
        tracker.next_r2ts(|| next_tag(next), &mut planned);
        for r in planned.drain(..) {
            let _ = self.out.send(Outbound::Pdu(Pdu::R2t(R2t {
                lun,
                itt,
                ttt: r.ttt,
                r2t_sn: r.r2t_sn,
                buffer_offset: r.offset,
                desired_length: r.length,
                ..R2t::default()
            })));
        }
        self.r2ts = planned;
    }

    /// Executes a write once it is both delivered in CmdSN order and has all its data.
    pub(super) fn try_execute_write(&mut self, itt: u32) {
        let ready = self.writes.get(&itt).is_some_and(|w| {
            w.command.is_some() && w.tracker.as_ref().is_ok_and(DataOutTracker::is_complete)
                || w.command.is_some() && w.tracker.is_err()
        });
        if !ready {
            return;
        }
        let Some(mut w) = self.writes.remove(&itt) else {
            return;
        };
        let Some(c) = w.command.take() else {
            return;
        };
        if !self.may_execute(&c) {
            return;
        }
        let tracker = match w.tracker {
            Ok(t) => t,
            Err(sense) => {
                let sense = Bytes::copy_from_slice(&sense.to_fixed_bytes());
                crate::exec::fail(&self.session, &self.out, &c, sense);
                return;
            }
        };
        let received = u32::try_from(tracker.received_bytes()).unwrap_or(u32::MAX);
        let luns = crate::target::LunView::current(&mut self.luns, self.session.target.as_deref());
        crate::exec::spawn(
            self.session.clone(),
            self.out.clone(),
            &self.pool,
            luns,
            c,
            w.segments,
            (received, tracker.r2t_count()),
            0,
        );
    }

    /// The connection is gone: writes still waiting for Data-Out can never complete (their
    /// data had to come on this connection, RFC 7143 allegiance), so their tasks end here, which
    /// also reopens their CmdSN window slots and lets the session drain.
    pub(in crate::connection) fn abandon_writes(&mut self) {
        for (itt, w) in self.writes.drain() {
            if w.command.is_some() {
                self.session.task_done(itt);
            }
        }
    }
}
