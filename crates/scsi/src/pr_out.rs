//! PERSISTENT RESERVE OUT (SPC-4 6.16, 5.9.6-5.9.11): register, reserve, release, clear,
//! preempt and register-and-move, with TransportID parsing for SPEC_I_PT.

use crate::lun::LogicalUnit;
use crate::pr::{kind, PrState, Registration, Reservation};
use crate::sense::{key, Sense};
use crate::ua::NexusIdentity;
use crate::{gather, ScsiRequest};

/// RESERVATION CONFLICT is a status, not sense; handlers return this marker.
pub(crate) enum PrError {
    Conflict,
    Sense(Sense),
}

impl From<Sense> for PrError {
    fn from(s: Sense) -> Self {
        PrError::Sense(s)
    }
}

fn be64(d: &[u8], at: usize) -> u64 {
    d.get(at..at + 8)
        .map_or(0, |x| x.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b)))
}

fn be32(d: &[u8], at: usize) -> u32 {
    d.get(at..at + 4)
        .map_or(0, |x| x.iter().fold(0u32, |a, &b| (a << 8) | u32::from(b)))
}

/// Parses one iSCSI TransportID at `d`; returns (name, isid, length consumed).
fn parse_transport_id(d: &[u8], at: usize) -> Result<(String, Option<[u8; 6]>, usize), Sense> {
    let b0 = d.get(at).copied().ok_or(Sense::param_list_length())?;
    if b0 & 0x0F != 0x05 {
        return Err(Sense::invalid_param(at, None));
    }
    let len = usize::from(u16::from_be_bytes([
        d.get(at + 2).copied().unwrap_or(0),
        d.get(at + 3).copied().unwrap_or(0),
    ]));
    let body = d
        .get(at + 4..at + 4 + len)
        .ok_or(Sense::param_list_length())?;
    let text: String = body
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as char)
        .collect();
    match b0 >> 6 {
        0 => Ok((text, None, 4 + len)),
        1 => {
            let lower = text.to_ascii_lowercase();
            let pos = lower
                .find(",i,0x")
                .ok_or(Sense::invalid_param(at + 4, None))?;
            let (name, rest) = text.split_at(pos);
            let hex = rest.get(5..).unwrap_or_default();
            let mut isid = [0u8; 6];
            for (i, x) in isid.iter_mut().enumerate() {
                let h = hex
                    .get(2 * i..2 * i + 2)
                    .ok_or(Sense::invalid_param(at + 4, None))?;
                *x = u8::from_str_radix(h, 16).map_err(|_| Sense::invalid_param(at + 4, None))?;
            }
            Ok((name.to_string(), Some(isid), 4 + len))
        }
        _ => Err(Sense::invalid_param(at, Some(7))),
    }
}

/// A decoded PERSISTENT RESERVE OUT.
pub(crate) struct OutParams {
    pub action: u8,
    pub scope: u8,
    pub kind_: u8,
    pub param_len: u32,
    pub res_key: u64,
    pub sa_key: u64,
    pub aptpl: bool,
    pub spec_i_pt: bool,
    pub all_tg_pt: bool,
    pub data: Vec<u8>,
}

/// A unit attention to raise once a change is committed: on every nexus but `except` that
/// one of `regs` matches.
pub(crate) struct UaIntent {
    asc: u8,
    ascq: u8,
    except: u64,
    regs: Vec<Registration>,
}

impl LogicalUnit {
    pub(crate) fn pr_out(
        &self,
        req: &ScsiRequest<'_>,
        action: u8,
        scope: u8,
        kind_: u8,
        param_len: u32,
    ) -> Result<(), Sense> {
        match self.pr_out_inner(req, action, scope, kind_, param_len) {
            Ok(()) => Ok(()),
            Err(PrError::Sense(s)) => Err(s),
            // Signalled through a sense-less marker the caller converts to the status.
            Err(PrError::Conflict) => Err(Sense::new(0xFF, 0, 0)),
        }
    }

    fn pr_out_inner(
        &self,
        req: &ScsiRequest<'_>,
        action: u8,
        scope: u8,
        kind_: u8,
        param_len: u32,
    ) -> Result<(), PrError> {
        let move_ = action == 7;
        let data = gather(req.data_out, param_len as usize);
        if data.len() < param_len as usize || param_len < 24 {
            return Err(Sense::param_list_length().into());
        }
        let flags = if move_ {
            data.get(17).copied().unwrap_or(0)
        } else {
            data.get(20).copied().unwrap_or(0)
        };
        let p = OutParams {
            action,
            scope,
            kind_,
            param_len,
            res_key: be64(&data, 0),
            sa_key: be64(&data, 8),
            aptpl: flags & 1 != 0,
            spec_i_pt: !move_ && flags & 0x08 != 0,
            all_tg_pt: !move_ && flags & 0x04 != 0,
            data,
        };
        if !p.spec_i_pt && !move_ && param_len != 24 {
            return Err(Sense::param_list_length().into());
        }
        if p.aptpl && self.cfg.pr_file.is_none() && self.cfg.pr_store.is_none() {
            return Err(Sense::invalid_param(20, Some(0)).into());
        }
        self.ua.ensure(req.nexus);
        if let Some(store) = &self.cfg.pr_store {
            return self.pr_out_shared(store.as_ref(), req, &p);
        }
        let mut pr = self.pr.write();
        let before = pr.clone();
        let mut uas = Vec::new();
        self.pr_apply(&mut pr, req, &p, &mut uas)?;
        if let Some(path) = &self.cfg.pr_file {
            if (pr.aptpl || before.aptpl) && pr.persist(path).is_err() {
                *pr = before;
                return Err(Sense::internal_failure().into());
            }
        }
        drop(pr);
        self.raise_pr_uas(uas);
        Ok(())
    }

    /// Raises the unit attentions a committed PERSISTENT RESERVE OUT calls for.
    /// With a store that reaches the other targets' nexuses (an HA pair), they get them too,
    /// before this returns.
    pub(crate) fn raise_pr_uas(&self, uas: Vec<UaIntent>) {
        let mut shared = Vec::new();
        for u in uas {
            self.ua.raise_where(u.asc, u.ascq, |id, who| {
                id != u.except && u.regs.iter().any(|x| x.matches(who))
            });
            if !u.regs.is_empty() && self.cfg.pr_store.is_some() {
                shared.push(crate::pr_store::attention_text(
                    u.asc,
                    u.ascq,
                    Some(&u.regs),
                ));
            }
        }
        for text in shared {
            self.share_attention(&text);
        }
    }

    /// Applies one PERSISTENT RESERVE OUT to `pr`; the unit attentions it calls for are added
    /// to `uas`, to be raised once the change is committed.
    pub(crate) fn pr_apply(
        &self,
        pr: &mut PrState,
        req: &ScsiRequest<'_>,
        p: &OutParams,
        uas: &mut Vec<UaIntent>,
    ) -> Result<(), PrError> {
        let OutParams {
            action,
            scope,
            kind_,
            param_len,
            res_key,
            sa_key,
            aptpl,
            spec_i_pt,
            all_tg_pt,
            ref data,
        } = *p;
        let me = NexusIdentity::of(req.nexus);
        let mine = pr.find(&me).cloned();
        match action {
            0 | 6 => {
                let ignore = action == 6;
                match &mine {
                    None => {
                        if !ignore && res_key != 0 {
                            return Err(PrError::Conflict);
                        }
                        if sa_key != 0 {
                            let mut new = vec![Registration {
                                key: sa_key,
                                name: me.name.to_string(),
                                isid: Some(me.isid),
                                rel_port: me.rel_port,
                                all_tg_pt,
                            }];
                            if spec_i_pt {
                                if ignore {
                                    return Err(Sense::invalid_param(20, Some(3)).into());
                                }
                                new.extend(self.spec_i_pt_list(
                                    data,
                                    param_len,
                                    sa_key,
                                    me.rel_port,
                                    all_tg_pt,
                                )?);
                            }
                            for r in new {
                                if !pr.regs.iter().any(|x| x.same_nexus(&r)) {
                                    pr.regs.push(r);
                                }
                            }
                        }
                    }
                    Some(reg) => {
                        if !ignore && res_key != reg.key {
                            return Err(PrError::Conflict);
                        }
                        if spec_i_pt {
                            return Err(Sense::invalid_param(20, Some(3)).into());
                        }
                        if sa_key == 0 {
                            self.unregister(pr, reg, req.nexus.id, uas);
                        } else {
                            for r in pr.regs.iter_mut().filter(|r| r.same_nexus(reg)) {
                                r.key = sa_key;
                            }
                            if let Some(res) = pr.reservation.as_mut() {
                                if res.holder.same_nexus(reg) {
                                    res.holder.key = sa_key;
                                }
                            }
                        }
                    }
                }
                pr.aptpl = aptpl;
                pr.generation = pr.generation.wrapping_add(1);
            }
            1 | 2 | 3 | 4 | 5 | 7 => {
                let reg = mine.ok_or(PrError::Conflict)?;
                if reg.key != res_key {
                    return Err(PrError::Conflict);
                }
                match action {
                    1 => {
                        if scope != 0 {
                            return Err(Sense::invalid_cdb(2, Some(7)).into());
                        }
                        if !kind::valid(kind_) {
                            return Err(Sense::invalid_cdb(2, Some(3)).into());
                        }
                        match &pr.reservation {
                            Some(r) if !pr.is_holder(&me) => {
                                let _ = r;
                                return Err(PrError::Conflict);
                            }
                            Some(r) if r.kind != kind_ => return Err(PrError::Conflict),
                            Some(_) => {}
                            None => {
                                pr.reservation = Some(Reservation {
                                    kind: kind_,
                                    holder: reg.clone(),
                                })
                            }
                        }
                    }
                    2 => {
                        if let Some(r) = pr.reservation.clone() {
                            if pr.is_holder(&me) {
                                if r.kind != kind_ || scope != 0 {
                                    return Err(Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x04).into());
                                }
                                pr.reservation = None;
                                if kind::registrants_only(r.kind) {
                                    uas.push(UaIntent {
                                        asc: 0x2A,
                                        ascq: 0x04,
                                        except: req.nexus.id,
                                        regs: pr.regs.clone(),
                                    });
                                }
                            }
                        }
                    }
                    3 => {
                        let regs = std::mem::take(&mut pr.regs);
                        pr.reservation = None;
                        pr.generation = pr.generation.wrapping_add(1);
                        uas.push(UaIntent {
                            asc: 0x2A,
                            ascq: 0x03,
                            except: req.nexus.id,
                            regs,
                        });
                    }
                    4 | 5 => self.preempt(pr, req, &reg, p, uas)?,
                    _ => self.register_and_move(pr, data, &reg, sa_key)?,
                }
            }
            _ => return Err(Sense::invalid_cdb(1, Some(4)).into()),
        }
        Ok(())
    }

    fn unregister(&self, pr: &mut PrState, reg: &Registration, me: u64, uas: &mut Vec<UaIntent>) {
        let holder = pr
            .reservation
            .as_ref()
            .is_some_and(|r| r.holder.same_nexus(reg));
        pr.regs.retain(|r| !r.same_nexus(reg));
        let Some(res) = pr.reservation.clone() else {
            return;
        };
        let release = if kind::all_registrants(res.kind) {
            pr.regs.is_empty()
        } else {
            holder
        };
        if release {
            pr.reservation = None;
            if kind::registrants_only(res.kind) && !kind::all_registrants(res.kind) {
                uas.push(UaIntent {
                    asc: 0x2A,
                    ascq: 0x04,
                    except: me,
                    regs: pr.regs.clone(),
                });
            }
        }
    }

    fn spec_i_pt_list(
        &self,
        data: &[u8],
        param_len: u32,
        key: u64,
        rel_port: u16,
        all: bool,
    ) -> Result<Vec<Registration>, PrError> {
        if param_len < 28 {
            return Err(Sense::param_list_length().into());
        }
        let list_len = be32(data, 24) as usize;
        if 28 + list_len > data.len() {
            return Err(Sense::param_list_length().into());
        }
        let mut at = 28;
        let mut out = Vec::new();
        while at < 28 + list_len {
            let (name, isid, used) = parse_transport_id(data, at)?;
            out.push(Registration {
                key,
                name,
                isid,
                rel_port,
                all_tg_pt: all,
            });
            at += used;
        }
        Ok(out)
    }

    fn preempt(
        &self,
        pr: &mut PrState,
        req: &ScsiRequest<'_>,
        me: &Registration,
        p: &OutParams,
        uas: &mut Vec<UaIntent>,
    ) -> Result<(), PrError> {
        let (sa_key, scope, kind_) = (p.sa_key, p.scope, p.kind_);
        let me_id = req.nexus.id;
        let res = pr.reservation.clone();
        let removed: Vec<Registration>;
        match res {
            Some(r) if kind::all_registrants(r.kind) && sa_key == 0 => {
                if scope != 0 || !kind::valid(kind_) {
                    return Err(Sense::invalid_cdb(2, None).into());
                }
                removed = pr
                    .regs
                    .iter()
                    .filter(|x| !x.same_nexus(me))
                    .cloned()
                    .collect();
                pr.regs.retain(|x| x.same_nexus(me));
                pr.reservation = Some(Reservation {
                    kind: kind_,
                    holder: me.clone(),
                });
            }
            Some(r) if !kind::all_registrants(r.kind) && r.holder.key == sa_key => {
                if scope != 0 || !kind::valid(kind_) {
                    return Err(Sense::invalid_cdb(2, None).into());
                }
                removed = pr
                    .regs
                    .iter()
                    .filter(|x| x.key == sa_key && !x.same_nexus(me))
                    .cloned()
                    .collect();
                pr.regs.retain(|x| x.key != sa_key || x.same_nexus(me));
                pr.reservation = Some(Reservation {
                    kind: kind_,
                    holder: me.clone(),
                });
            }
            _ => {
                if sa_key == 0 {
                    return Err(Sense::invalid_param(8, None).into());
                }
                removed = pr
                    .regs
                    .iter()
                    .filter(|x| x.key == sa_key && !x.same_nexus(me))
                    .cloned()
                    .collect();
                if removed.is_empty() {
                    return Err(PrError::Conflict);
                }
                pr.regs.retain(|x| x.key != sa_key || x.same_nexus(me));
            }
        }
        pr.generation = pr.generation.wrapping_add(1);
        uas.push(UaIntent {
            asc: 0x2A,
            ascq: 0x03,
            except: me_id,
            regs: removed,
        });
        Ok(())
    }

    fn register_and_move(
        &self,
        pr: &mut PrState,
        data: &[u8],
        me: &Registration,
        sa_key: u64,
    ) -> Result<(), PrError> {
        let Some(res) = pr.reservation.clone() else {
            return Err(PrError::Conflict);
        };
        if kind::all_registrants(res.kind) || !res.holder.same_nexus(me) {
            return Err(PrError::Conflict);
        }
        if sa_key == 0 {
            return Err(Sense::invalid_param(8, None).into());
        }
        let unreg = data.get(17).is_some_and(|b| b & 0x02 != 0);
        let rel_port = u16::from_be_bytes([
            data.get(18).copied().unwrap_or(0),
            data.get(19).copied().unwrap_or(0),
        ]);
        let tid_len = be32(data, 20) as usize;
        if 24 + tid_len > data.len() || tid_len < 4 {
            return Err(Sense::param_list_length().into());
        }
        let (name, isid, _) = parse_transport_id(data, 24)?;
        let dest = Registration {
            key: sa_key,
            name,
            isid,
            rel_port,
            all_tg_pt: false,
        };
        if dest.same_nexus(me) {
            return Err(Sense::invalid_param(24, None).into());
        }
        pr.regs.retain(|r| !r.same_nexus(&dest));
        pr.regs.push(dest.clone());
        pr.reservation = Some(Reservation {
            kind: res.kind,
            holder: dest,
        });
        if unreg {
            pr.regs.retain(|r| !r.same_nexus(me));
        }
        pr.generation = pr.generation.wrapping_add(1);
        Ok(())
    }
}
