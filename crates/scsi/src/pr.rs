//! Reservations: SPC-2 RESERVE/RELEASE and SPC-4 persistent reservations — state, the
//! conflict table (SPC-4 5.9.1), PERSISTENT RESERVE IN and APTPL persistence.

use crate::cdb::Command;
use crate::lun::LogicalUnit;
use crate::sense::Sense;
use crate::ua::NexusIdentity;
use crate::{put_truncated, Error, Nexus};
use bytes::BytesMut;
use std::path::Path;

/// Persistent reservation types (SPC-4 table 169).
#[allow(dead_code)]
pub(crate) mod kind {
    pub const WRITE_EXCLUSIVE: u8 = 1;
    pub const EXCLUSIVE_ACCESS: u8 = 3;
    pub const WE_REGISTRANTS_ONLY: u8 = 5;
    pub const EA_REGISTRANTS_ONLY: u8 = 6;
    pub const WE_ALL_REGISTRANTS: u8 = 7;
    pub const EA_ALL_REGISTRANTS: u8 = 8;
    pub fn valid(k: u8) -> bool {
        matches!(k, 1 | 3 | 5 | 6 | 7 | 8)
    }
    pub fn all_registrants(k: u8) -> bool {
        matches!(k, 7 | 8)
    }
    pub fn registrants_only(k: u8) -> bool {
        matches!(k, 5..=8)
    }
}

/// An initiator port as a registration names it: `isid == None` means every port of that
/// initiator (TransportID format 00b).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Registration {
    pub key: u64,
    pub name: String,
    pub isid: Option<[u8; 6]>,
    pub rel_port: u16,
    pub all_tg_pt: bool,
}

impl Registration {
    pub fn matches(&self, who: &NexusIdentity) -> bool {
        self.name.eq_ignore_ascii_case(&who.name)
            && !matches!(self.isid, Some(i) if i != who.isid)
            && (self.all_tg_pt || self.rel_port == who.rel_port)
    }
    pub fn same_nexus(&self, other: &Registration) -> bool {
        self.name.eq_ignore_ascii_case(&other.name)
            && self.isid == other.isid
            && self.rel_port == other.rel_port
    }
}

/// The reservation itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reservation {
    pub kind: u8,
    /// Index-free copy of the holder's registration (ignored for all-registrants types).
    pub holder: Registration,
}

/// All reservation state of a logical unit.
#[derive(Debug, Default, Clone)]
pub(crate) struct PrState {
    pub generation: u32,
    pub regs: Vec<Registration>,
    pub reservation: Option<Reservation>,
    pub aptpl: bool,
    /// SPC-2 RESERVE holder (its I_T nexus as a registration with key 0); not persistent. With
    /// a store that shares it (an HA pair) it is part of the shared state.
    pub legacy_holder: Option<Registration>,
    /// With a shared store: the store's version this state was read from or written as
    /// (0 before the first load).
    pub store_version: u64,
}

/// How a command is treated by the conflict table.
#[derive(PartialEq)]
enum Access {
    Always,
    Read,
    Write,
}

fn access_of(cmd: &Command) -> Access {
    match cmd {
        Command::Inquiry { .. }
        | Command::ReportLuns { .. }
        | Command::RequestSense { .. }
        | Command::TestUnitReady
        | Command::ReadCapacity10
        | Command::ReadCapacity16 { .. }
        | Command::PersistentReserveIn { .. }
        | Command::PersistentReserveOut { .. }
        | Command::ReportTargetPortGroups { .. }
        | Command::ReportSupportedOpcodes { .. }
        | Command::ReportSupportedTmf { .. }
        | Command::PreventAllow { prevent: 0 } => Access::Always,
        Command::Read(_)
        | Command::Verify { .. }
        | Command::PreFetch { .. }
        | Command::ModeSense { .. }
        | Command::GetLbaStatus { .. }
        | Command::ReceiveCopyResults { .. } => Access::Read,
        _ => Access::Write,
    }
}

impl PrState {
    /// Whether going from (`regs`, `reservation`) to this state can take access away from
    /// some I_T nexus: the reservation appeared, went, changed type or holder (a holder's new
    /// key is the same holder), or a registered nexus is registered no more (unregistered,
    /// preempted, cleared). A registration that only changed its key takes nothing away.
    pub fn takes_access_from(
        &self,
        regs: &[Registration],
        reservation: &Option<Reservation>,
    ) -> bool {
        let reservation_changed = match (reservation, &self.reservation) {
            (None, None) => false,
            (Some(a), Some(b)) => {
                a.kind != b.kind
                    || !(kind::all_registrants(a.kind) || a.holder.same_nexus(&b.holder))
            }
            _ => true,
        };
        reservation_changed
            || regs
                .iter()
                .any(|r| !self.regs.iter().any(|n| n.same_nexus(r)))
    }

    pub fn find(&self, who: &NexusIdentity) -> Option<&Registration> {
        self.regs.iter().find(|r| r.matches(who))
    }

    pub fn is_holder(&self, who: &NexusIdentity) -> bool {
        match &self.reservation {
            None => false,
            Some(r) if kind::all_registrants(r.kind) => self.find(who).is_some(),
            Some(r) => r.holder.matches(who),
        }
    }

    /// SPC-4 5.9.1 and SPC-2 7.21: does `cmd` from `n` conflict with the reservation state?
    pub fn conflicts(&self, n: &Nexus, cmd: &Command) -> bool {
        let legacy_cmd = matches!(cmd, Command::Reserve | Command::Release);
        if let Some(h) = &self.legacy_holder {
            if !h.matches(&NexusIdentity::of(n)) {
                let allowed = matches!(
                    cmd,
                    Command::Inquiry { .. }
                        | Command::ReportLuns { .. }
                        | Command::RequestSense { .. }
                        | Command::Release
                        | Command::ReportTargetPortGroups { .. }
                        | Command::ReportSupportedOpcodes { .. }
                ) || matches!(cmd, Command::PreventAllow { prevent: 0 });
                return !allowed;
            }
        }
        if legacy_cmd {
            // SPC-4 5.9.3: RESERVE/RELEASE conflict once anybody holds a PR registration.
            return !self.regs.is_empty();
        }
        let Some(res) = &self.reservation else {
            return false;
        };
        let access = access_of(cmd);
        if access == Access::Always {
            return false;
        }
        let who = NexusIdentity::of(n);
        if self.is_holder(&who) {
            return false;
        }
        let registered = self.find(&who).is_some();
        match res.kind {
            kind::WRITE_EXCLUSIVE => access == Access::Write,
            kind::EXCLUSIVE_ACCESS => true,
            kind::WE_REGISTRANTS_ONLY | kind::WE_ALL_REGISTRANTS => {
                !registered && access == Access::Write
            }
            _ => !registered,
        }
    }

    /// Serialises the persistent part (registrations, reservation) as text lines.
    pub fn to_text(&self) -> String {
        let mut s = format!("lanes-pr 1\ngeneration {}\n", self.generation);
        let reg_line = Self::reg_line;
        for r in &self.regs {
            s.push_str(&format!("reg {}\n", reg_line(r)));
        }
        if let Some(res) = &self.reservation {
            s.push_str(&format!("res {} {}\n", res.kind, reg_line(&res.holder)));
        }
        s
    }

    /// One registration as a line of the state text (after `reg ` or `res KIND `).
    pub fn reg_line(r: &Registration) -> String {
        let isid = r.isid.map_or("-".to_string(), |i| {
            i.iter().map(|b| format!("{b:02x}")).collect()
        });
        format!(
            "{:016x} {} {} {} {}",
            r.key,
            isid,
            r.rel_port,
            u8::from(r.all_tg_pt),
            r.name
        )
    }

    /// [`Self::to_text`] plus the APTPL bit, for a shared store (where the state is kept
    /// whatever APTPL says, and the bit is only reported).
    pub fn to_shared_text(&self) -> String {
        format!("{}aptpl {}\n", self.to_text(), u8::from(self.aptpl))
    }

    /// [`Self::to_shared_text`] plus the SPC-2 RESERVE holder, for a store that shares it.
    pub fn to_shared_text_with_legacy(&self) -> String {
        let mut s = self.to_shared_text();
        if let Some(h) = &self.legacy_holder {
            s.push_str(&format!("legacy {}\n", Self::reg_line(h)));
        }
        s
    }

    /// Whether `n` holds the SPC-2 reservation.
    pub fn is_legacy_holder(&self, n: &Nexus) -> bool {
        self.legacy_holder
            .as_ref()
            .is_some_and(|h| h.matches(&NexusIdentity::of(n)))
    }

    pub(crate) fn parse_reg(words: &[&str]) -> Option<Registration> {
        let [key, isid, rel, all, name] = words else {
            return None;
        };
        let isid = if *isid == "-" {
            None
        } else {
            let mut b = [0u8; 6];
            for (i, x) in b.iter_mut().enumerate() {
                *x = u8::from_str_radix(isid.get(2 * i..2 * i + 2)?, 16).ok()?;
            }
            Some(b)
        };
        Some(Registration {
            key: u64::from_str_radix(key, 16).ok()?,
            name: (*name).to_string(),
            isid,
            rel_port: rel.parse().ok()?,
            all_tg_pt: *all == "1",
        })
    }

    /// Parses [`Self::to_text`] output.
    pub fn from_text(text: &str) -> Option<Self> {
        let mut st = PrState {
            aptpl: true,
            ..Default::default()
        };
        let mut lines = text.lines();
        if lines.next()? != "lanes-pr 1" {
            return None;
        }
        for line in lines {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["generation", g] => st.generation = g.parse().ok()?,
                ["reg", rest @ ..] => st.regs.push(Self::parse_reg(rest)?),
                ["res", k, rest @ ..] => {
                    st.reservation = Some(Reservation {
                        kind: k.parse().ok()?,
                        holder: Self::parse_reg(rest)?,
                    })
                }
                ["aptpl", a] => st.aptpl = *a == "1",
                ["legacy", rest @ ..] => st.legacy_holder = Some(Self::parse_reg(rest)?),
                [""] => {}
                _ => return None,
            }
        }
        Some(st)
    }

    /// Loads persisted state; a missing file is empty state.
    pub fn load(path: &Path) -> Result<Self, Error> {
        match std::fs::read_to_string(path) {
            Ok(t) => Self::from_text(&t).ok_or_else(|| Error::PrFile {
                path: path.display().to_string(),
                reason: "unparsable".into(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(Error::PrFile {
                path: path.display().to_string(),
                reason: e.to_string(),
            }),
        }
    }

    /// Writes the state atomically (temp file, fsync, rename, fsync directory); with APTPL
    /// off the file is removed so a restart starts clean.
    pub fn persist(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        if !self.aptpl {
            return match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(self.to_text().as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// iSCSI TransportID (SPC-4 7.6.4.6) of a registration: format 01b when the ISID is known.
pub(crate) fn transport_id(r: &Registration) -> Vec<u8> {
    let mut name = r.name.clone().into_bytes();
    let format = if let Some(isid) = r.isid {
        name.extend_from_slice(b",i,0x");
        for b in isid {
            name.extend_from_slice(format!("{b:02x}").as_bytes());
        }
        0x40
    } else {
        0
    };
    name.push(0);
    while name.len() & 3 != 0 {
        name.push(0);
    }
    let mut t = vec![format | 0x05, 0];
    t.extend_from_slice(&(name.len() as u16).to_be_bytes());
    t.extend_from_slice(&name);
    t
}

impl LogicalUnit {
    pub(crate) fn pr_in(&self, action: u8, alloc: u32, out: &mut BytesMut) -> Result<(), Sense> {
        if let Err(e) = self.refresh_pr() {
            tracing::warn!("persistent reservation state: {e}");
            return Err(Sense::internal_failure());
        }
        let pr = self.pr.read();
        let mut b = Vec::new();
        b.extend_from_slice(&pr.generation.to_be_bytes());
        match action {
            0 => {
                b.extend_from_slice(&((pr.regs.len() * 8) as u32).to_be_bytes());
                for r in &pr.regs {
                    b.extend_from_slice(&r.key.to_be_bytes());
                }
            }
            1 => match &pr.reservation {
                None => b.extend_from_slice(&0u32.to_be_bytes()),
                Some(res) => {
                    b.extend_from_slice(&16u32.to_be_bytes());
                    let key = if kind::all_registrants(res.kind) {
                        0
                    } else {
                        res.holder.key
                    };
                    b.extend_from_slice(&key.to_be_bytes());
                    b.extend_from_slice(&[0, 0, 0, 0, 0, res.kind & 0x0F, 0, 0]);
                }
            },
            2 => {
                b.clear();
                b.extend_from_slice(&8u16.to_be_bytes());
                // CRH=1, SIP_C, ATP_C, PTPL_C (if a file is configured).
                let ptpl = self.cfg.pr_file.is_some() || self.cfg.pr_store.is_some();
                b.push(0x10 | 0x08 | 0x04 | u8::from(ptpl));
                // TMV, ALLOW COMMANDS = 001b, PTPL_A.
                b.push(0x80 | 0x10 | u8::from(pr.aptpl));
                b.push(0x80 | 0x40 | 0x20 | 0x08 | 0x02);
                b.push(0x01);
                b.extend_from_slice(&[0, 0]);
            }
            _ => {
                let mut descs = Vec::new();
                for r in &pr.regs {
                    let holder = pr.reservation.as_ref().is_some_and(|res| {
                        kind::all_registrants(res.kind) || res.holder.same_nexus(r)
                    });
                    descs.extend_from_slice(&r.key.to_be_bytes());
                    descs.extend_from_slice(&[0; 4]);
                    descs.push(u8::from(r.all_tg_pt) << 1 | u8::from(holder));
                    descs.push(if holder {
                        pr.reservation.as_ref().map_or(0, |x| x.kind & 0x0F)
                    } else {
                        0
                    });
                    descs.extend_from_slice(&[0; 4]);
                    descs.extend_from_slice(&r.rel_port.to_be_bytes());
                    let t = transport_id(r);
                    descs.extend_from_slice(&(t.len() as u32).to_be_bytes());
                    descs.extend_from_slice(&t);
                }
                b.extend_from_slice(&(descs.len() as u32).to_be_bytes());
                b.extend_from_slice(&descs);
            }
        }
        put_truncated(out, &b, alloc);
        Ok(())
    }
}

/// The reservation state behind its lock, plus one atomic that says whether any reservation,
/// registration or SPC-2 RESERVE exists: while none does (the usual case), commands skip the
/// lock entirely, so no lock sits on every I/O of the logical unit.
#[derive(Debug, Default)]
pub(crate) struct PrLock {
    state: parking_lot::RwLock<PrState>,
    in_use: std::sync::atomic::AtomicBool,
    /// The shared store carries the SPC-2 RESERVE holder too (an HA pair): installs take it.
    pub shares_legacy: std::sync::atomic::AtomicBool,
}

/// Write access; the `in_use` flag is recomputed when it drops.
pub(crate) struct PrWriteGuard<'a> {
    guard: parking_lot::RwLockWriteGuard<'a, PrState>,
    in_use: &'a std::sync::atomic::AtomicBool,
}

impl std::ops::Deref for PrWriteGuard<'_> {
    type Target = PrState;
    fn deref(&self) -> &PrState {
        &self.guard
    }
}

impl std::ops::DerefMut for PrWriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut PrState {
        &mut self.guard
    }
}

impl Drop for PrWriteGuard<'_> {
    fn drop(&mut self) {
        let g = &self.guard;
        let used = g.legacy_holder.is_some() || g.reservation.is_some() || !g.regs.is_empty();
        self.in_use
            .store(used, std::sync::atomic::Ordering::Release);
    }
}

impl PrLock {
    pub fn new(state: PrState) -> Self {
        let lock = PrLock::default();
        *lock.write() = state;
        lock
    }

    /// Takes a newer state from a shared store: registrations, reservation, generation and
    /// APTPL are replaced (the SPC-2 RESERVE holder stays this gateway's own) when `version`
    /// is newer than the one held. `None` text is an empty state; unparsable text is refused.
    pub fn install(&self, text: Option<&str>, version: u64) -> bool {
        let new = match text {
            None | Some("") => PrState::default(),
            Some(t) => match PrState::from_text(t) {
                Some(st) => st,
                None => {
                    tracing::warn!("shared reservation state (version {version}) is unparsable");
                    return false;
                }
            },
        };
        self.install_state(new, version)
    }

    /// As [`Self::install`], with the state already parsed.
    pub fn install_state(&self, new: PrState, version: u64) -> bool {
        let mut g = self.write();
        if version <= g.store_version {
            return false;
        }
        let legacy = if self
            .shares_legacy
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            new.legacy_holder.clone()
        } else {
            g.legacy_holder.take()
        };
        *g = PrState {
            legacy_holder: legacy,
            store_version: version,
            ..new
        };
        true
    }

    pub fn read(&self) -> parking_lot::RwLockReadGuard<'_, PrState> {
        self.state.read()
    }

    pub fn write(&self) -> PrWriteGuard<'_> {
        PrWriteGuard {
            guard: self.state.write(),
            in_use: &self.in_use,
        }
    }

    /// SPC-4 5.9.1: does `cmd` from `n` conflict? Lock-free while no reservation state exists.
    pub fn conflicts(&self, n: &Nexus, cmd: &Command) -> bool {
        self.in_use.load(std::sync::atomic::Ordering::Acquire) && self.read().conflicts(n, cmd)
    }
}
