//! The logical units of one target: LUN addressing, REPORT LUNS, commands to absent LUNs and
//! the task-management hooks that fan out to every LU.

use crate::cdb::op;
use crate::inquiry::missing_lun_inquiry;
use crate::lun::LogicalUnit;
use crate::sense::Sense;
use crate::{put_truncated, Nexus, ScsiOutcome, ScsiRequest};
use bytes::BytesMut;
use std::sync::Arc;

/// REPORTED LUNS DATA HAS CHANGED (SPC-4 6.37): raised when the LUN inventory changes.
pub const REPORTED_LUNS_CHANGED: (u8, u8) = (0x3F, 0x0E);

/// All LUs of a target, by LUN.
#[derive(Clone, Default)]
pub struct LunMap {
    luns: Vec<(u64, Arc<LogicalUnit>)>,
}

/// SAM-5 4.7.3 single-level LUN: peripheral addressing below 256, flat space up to 16383.
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut b = [0u8; 8];
    if lun < 256 {
        b[1] = lun as u8;
    } else {
        b[0] = 0x40 | ((lun >> 8) & 0x3F) as u8;
        b[1] = lun as u8;
    }
    b
}

/// (sense key, ASC, ASCQ) of fixed or descriptor format sense data.
fn sense_data_triplet(data: &[u8]) -> (u8, u8, u8) {
    let at = |i: usize| data.get(i).copied().unwrap_or(0);
    match at(0) & 0x7F {
        0x70 | 0x71 => (at(2) & 0x0F, at(12), at(13)),
        0x72 | 0x73 => (at(1) & 0x0F, at(2), at(3)),
        _ => (0, 0, 0),
    }
}

impl LunMap {
    /// Builds the map; each LU learns its peers so EXTENDED COPY can reach them.
    pub fn new(mut luns: Vec<(u64, Arc<LogicalUnit>)>) -> Self {
        luns.sort_by_key(|(l, _)| *l);
        luns.dedup_by_key(|(l, _)| *l);
        let weak: Vec<_> = luns.iter().map(|(_, lu)| Arc::downgrade(lu)).collect();
        for (_, lu) in &luns {
            *lu.peers.write() = weak.clone();
        }
        Self { luns }
    }

    /// A new map: this one without `removed`, plus `added` (replacing LUs of the same
    /// number). Nothing is raised; see [`LunMap::inventory_changed`].
    pub fn with_changes(&self, removed: &[u64], added: Vec<(u64, Arc<LogicalUnit>)>) -> LunMap {
        let mut luns: Vec<_> = self
            .luns
            .iter()
            .filter(|(l, _)| !removed.contains(l) && !added.iter().any(|(a, _)| a == l))
            .cloned()
            .collect();
        luns.extend(added);
        LunMap::new(luns)
    }

    /// After the LUN inventory changed: every nexus gets REPORTED LUNS DATA HAS CHANGED on
    /// every LU it already knew, and the `added` LUs learn the `nexuses` logged in before them
    /// with the same condition. A nexus is told once: reporting it on one LU clears it on the
    /// others ([`LunMap::execute`]).
    pub fn inventory_changed<'a>(
        &self,
        added: &[u64],
        nexuses: impl IntoIterator<Item = &'a Nexus>,
    ) {
        let (asc, ascq) = REPORTED_LUNS_CHANGED;
        for (lun, lu) in &self.luns {
            if !added.contains(lun) {
                lu.raise_unit_attention(asc, ascq);
            }
        }
        for n in nexuses {
            for (_, lu) in self.luns.iter().filter(|(l, _)| added.contains(l)) {
                lu.nexus_joined(n, REPORTED_LUNS_CHANGED);
            }
        }
    }

    /// The LU at `lun`.
    pub fn get(&self, lun: u64) -> Option<&Arc<LogicalUnit>> {
        self.luns.iter().find(|(l, _)| *l == lun).map(|(_, lu)| lu)
    }

    /// All `(lun, LU)` pairs in LUN order.
    pub fn luns(&self) -> &[(u64, Arc<LogicalUnit>)] {
        &self.luns
    }

    /// [`LogicalUnit::execute_nowait`] for `req.lun`; `None` for anything else.
    pub fn execute_nowait(
        &self,
        req: &ScsiRequest<'_>,
        data_in: &mut BytesMut,
    ) -> Option<ScsiOutcome> {
        self.get(req.lun)?.execute_nowait(req, data_in)
    }

    /// [`LogicalUnit::submit`] for `req.lun`; `Err(data_in)` for anything else.
    pub fn submit(
        &self,
        req: &ScsiRequest<'_>,
        data_in: BytesMut,
        stream: Option<crate::aio::Streamed>,
    ) -> Result<crate::aio::Submitted, BytesMut> {
        match self.get(req.lun) {
            Some(lu) if lu.has_aio() => lu.submit(req, data_in, stream),
            _ => Err(data_in),
        }
    }

    /// [`LogicalUnit::is_buffered_write`] for `lun`; false when there is no such LU.
    pub fn is_buffered_write(&self, lun: u64, cdb: &[u8]) -> bool {
        self.get(lun).is_some_and(|lu| lu.is_buffered_write(cdb))
    }

    /// Executes a command addressed to `req.lun`.
    pub fn execute(&self, req: &ScsiRequest<'_>, data_in: &mut BytesMut) -> ScsiOutcome {
        let opcode = req.cdb.first().copied().unwrap_or(0xFF);
        if opcode == op::REPORT_LUNS {
            return self.report_luns(req, data_in);
        }
        if let Some(lu) = self.get(req.lun) {
            let outcome = lu.execute(req, data_in);
            let reported = match &outcome.sense {
                Some(s) => (s.key, s.asc, s.ascq),
                // REQUEST SENSE hands a pending unit attention over as its data.
                None if opcode == op::REQUEST_SENSE => sense_data_triplet(data_in),
                None => (0, 0, 0),
            };
            let (asc, ascq) = REPORTED_LUNS_CHANGED;
            if reported == (crate::sense::key::UNIT_ATTENTION, asc, ascq) {
                self.reported_luns_change_seen(req.nexus, req.lun);
            }
            return outcome;
        }
        match crate::decode_cdb(req.cdb) {
            Ok(crate::Command::Inquiry { evpd, alloc, .. }) => {
                missing_lun_inquiry(evpd, alloc, data_in);
                ScsiOutcome::good()
            }
            Ok(crate::Command::RequestSense { alloc, desc }) => {
                let s = Sense::lun_not_supported();
                if desc {
                    put_truncated(data_in, &s.to_descriptor_bytes(), alloc);
                } else {
                    put_truncated(data_in, &s.to_fixed_bytes(), alloc);
                }
                ScsiOutcome::good()
            }
            _ => ScsiOutcome::check(Sense::lun_not_supported()),
        }
    }

    /// The nexus has been told the inventory changed (through `seen_on`): the other LUs no
    /// longer hold that condition for it, so it is reported once per I_T nexus.
    fn reported_luns_change_seen(&self, n: &Nexus, seen_on: u64) {
        let (asc, ascq) = REPORTED_LUNS_CHANGED;
        for (_, lu) in self.luns.iter().filter(|(l, _)| *l != seen_on) {
            lu.clear_unit_attention(n.id, asc, ascq);
        }
    }

    fn report_luns(&self, req: &ScsiRequest<'_>, out: &mut BytesMut) -> ScsiOutcome {
        let (select, alloc) = match crate::decode_cdb(req.cdb) {
            Ok(crate::Command::ReportLuns { select, alloc }) => (select, alloc),
            Err(s) => return ScsiOutcome::check(s),
            Ok(_) => return ScsiOutcome::check(Sense::invalid_opcode()),
        };
        if alloc < 16 {
            return ScsiOutcome::check(Sense::invalid_cdb(6, None));
        }
        let list: Vec<u64> = match select {
            0 | 2 => self.luns.iter().map(|(l, _)| *l).collect(),
            1 => Vec::new(),
            0x10..=0x12 => self
                .luns
                .iter()
                .map(|(l, _)| *l)
                .filter(|_| select != 0x11 || req.lun == 0)
                .collect(),
            _ => return ScsiOutcome::check(Sense::invalid_cdb(2, None)),
        };
        let mut b = Vec::with_capacity(8 + 8 * list.len());
        b.extend_from_slice(&((list.len() * 8) as u32).to_be_bytes());
        b.extend_from_slice(&[0; 4]);
        for l in list {
            b.extend_from_slice(&encode_lun(l));
        }
        put_truncated(out, &b, alloc);
        ScsiOutcome::good()
    }

    /// A new session: every LU registers it (with a power-on unit attention).
    pub fn nexus_added(&self, n: &Nexus) {
        for (_, lu) in &self.luns {
            lu.nexus_added(n);
        }
    }

    /// A session ended (I_T nexus loss).
    pub fn nexus_removed(&self, n: &Nexus) {
        for (_, lu) in &self.luns {
            lu.nexus_removed(n);
        }
    }

    /// Whether `n` holds an SPC-2 reservation shared with another node on any LU.
    pub fn holds_shared_reservation(&self, n: &Nexus) -> bool {
        self.luns
            .iter()
            .any(|(_, lu)| lu.holds_shared_reservation(n))
    }

    /// Releases `n`'s shared SPC-2 reservations (blocking; see
    /// [`LogicalUnit::release_shared_reservation`]).
    pub fn release_shared_reservations(&self, n: &Nexus) {
        for (_, lu) in &self.luns {
            lu.release_shared_reservation(n);
        }
    }

    /// LOGICAL UNIT RESET task management function.
    pub fn lun_reset(&self, lun: u64, by: &Nexus) -> bool {
        self.get(lun).map(|lu| lu.lun_reset(Some(by))).is_some()
    }

    /// TARGET WARM RESET (`cold == false`) or TARGET COLD RESET.
    pub fn target_reset(&self, cold: bool) {
        for (_, lu) in &self.luns {
            lu.target_reset(cold);
        }
    }

    /// A target reset's effects on the other node of a pair (blocking; see
    /// [`LogicalUnit::share_target_reset`]).
    pub fn share_target_reset(&self, cold: bool) {
        for (_, lu) in &self.luns {
            lu.share_target_reset(cold);
        }
    }

    /// CLEAR TASK SET on `lun` by `by`.
    pub fn clear_task_set(&self, lun: u64, by: &Nexus) {
        if let Some(lu) = self.get(lun) {
            lu.clear_task_set(by);
        }
    }
}
