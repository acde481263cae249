//! Persistent reservations shared by several targets that export one logical unit (gateways
//! over one RBD image): the state lives in a [`PrStore`], changed by compare-and-set on the
//! store's version, and every gateway is told of each change before the PERSISTENT RESERVE
//! OUT that made it completes, so each gateway's conflict check stays local and current.

use crate::lun::LogicalUnit;
use crate::pr::PrState;
use crate::pr_out::{OutParams, PrError, UaIntent};
use crate::sense::Sense;
use crate::ScsiRequest;
use std::io;

/// What [`PrStore::store_if`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreResult {
    /// Written; the store's version is now this.
    Stored(u64),
    /// The store's version was not the one given: somebody else changed it first.
    Conflict,
}

/// Called with the state text and version another gateway announced.
pub type PrChangeFn = Box<dyn Fn(Option<&str>, u64) -> bool + Send + Sync>;

/// Called with unit attentions another target raised for this target's nexuses (text as
/// [`LogicalUnit::raise_shared_attention`] reads it). Returns whether the notice may be
/// acknowledged: false when a reset's commands under way here did not end in time (the
/// sender then fences this target rather than trust it).
pub type NoticeFn = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// How long a reset made through another target waits for the commands under way here.
pub const RESET_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Reservation state shared by every gateway of a logical unit.
pub trait PrStore: Send + Sync {
    /// The current state text (`None`: nothing stored yet) and its version.
    fn load(&self) -> io::Result<(Option<String>, u64)>;
    /// Replaces the state with `text` if the store's version is still `version`.
    fn store_if(&self, version: u64, text: &str) -> io::Result<StoreResult>;
    /// Tells every other gateway that the state changed to `text` at `version`, and returns
    /// once they have taken it (or a timeout passed, which is an error).
    fn announce(&self, version: u64, text: &str) -> io::Result<()>;
    /// Registers what to call when a change is announced (once, when the logical unit is
    /// created); each gateway's call must have taken the state before it acknowledges.
    fn subscribe(&self, on_change: PrChangeFn);
    /// Raises unit attentions on the nexuses of the other targets of this logical unit and
    /// returns once they have them. Stores that cannot reach the other targets' nexuses do
    /// nothing (the default).
    fn notify(&self, _attention: &str) -> io::Result<()> {
        Ok(())
    }
    /// Registers what to call with another target's unit attentions (once, when the logical
    /// unit is created). The default never calls it.
    fn subscribe_notices(&self, _on_notice: NoticeFn) {}
    /// Whether a reset notice from another target waits for the commands under way here
    /// before it is acknowledged (stores whose notices arrive on a thread of their own, which
    /// may block). Default: no.
    fn drains_on_reset(&self) -> bool {
        false
    }
    /// Whether the SPC-2 RESERVE holder is part of the shared state (an HA pair, whose
    /// nexuses are named alike on both nodes). Default: each target keeps its own.
    fn shares_legacy(&self) -> bool {
        false
    }
}

/// How often a PERSISTENT RESERVE OUT reloads and redoes its change after losing a race with
/// another gateway before it gives up.
pub(crate) const STORE_ATTEMPTS: usize = 8;

/// Parses stored state text (`None` or empty: no state).
fn parse(text: Option<&str>) -> Option<PrState> {
    match text {
        None | Some("") => Some(PrState::default()),
        Some(t) => PrState::from_text(t),
    }
}

/// Waits out the commands under way here; false (and a warning) when some are still running
/// after [`RESET_DRAIN`]: the change is then not acknowledged, and its sender fences this one.
fn drained_or_warn(drain: &crate::drain::Drain, what: &str) -> bool {
    let drained = drain.wait(RESET_DRAIN);
    if !drained {
        tracing::warn!(
            "{what} through another target: commands here still under way after {:?}; \
             not acknowledged (that target fences this one)",
            RESET_DRAIN
        );
    }
    drained
}

impl LogicalUnit {
    /// Creates the link to the store: loads its state and subscribes to changes.
    pub(crate) fn attach_pr_store(&self) -> Result<(), crate::Error> {
        let Some(store) = &self.cfg.pr_store else {
            return Ok(());
        };
        if store.shares_legacy() {
            self.pr
                .shares_legacy
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let weak = std::sync::Arc::downgrade(&self.pr);
        let drains = store.drains_on_reset();
        let drain_on_change = std::sync::Arc::downgrade(&self.drain);
        store.subscribe(Box::new(move |text, version| {
            let Some(pr) = weak.upgrade() else {
                return true;
            };
            let before = drains.then(|| {
                let st = pr.read();
                (st.regs.clone(), st.reservation.clone())
            });
            if !pr.install(text, version) {
                return true;
            }
            // A change that took access away (PREEMPT AND ABORT, PREEMPT, CLEAR, a holder
            // released or replaced) made through another target: commands that passed their
            // conflict check here under the old state must have ended before it completes
            // there, as for a reset. (A key changed by REGISTER takes nothing away: no wait.)
            let Some((regs, reservation)) = before else {
                return true;
            };
            let took_access = pr.read().takes_access_from(&regs, &reservation);
            match drain_on_change.upgrade() {
                Some(d) if took_access => drained_or_warn(&d, "a reservation change"),
                _ => true,
            }
        }));
        let ua = std::sync::Arc::downgrade(&self.ua);
        let drain = std::sync::Arc::downgrade(&self.drain);
        store.subscribe_notices(Box::new(move |text| {
            if let Some(ua) = ua.upgrade() {
                raise_attention_text(&ua, text);
            }
            // A reset (29/xx) made through another target: the commands that passed their
            // unit attention check here before it must have ended before it completes there.
            if !drains || !text.starts_with("ua 29 ") {
                return true;
            }
            let Some(drain) = drain.upgrade() else {
                return true;
            };
            drained_or_warn(&drain, "a reset")
        }));
        self.refresh_pr()
            .map_err(|e| crate::Error::Config(format!("shared reservation state: {e}")))
    }

    /// Whether the SPC-2 RESERVE holder is shared through the store.
    pub(crate) fn shares_legacy(&self) -> bool {
        self.pr
            .shares_legacy
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Changes the shared SPC-2 RESERVE holder: load, `change`, compare-and-set (redone when
    /// the other node changed the state first). `None` if the store failed.
    pub(crate) fn change_legacy(
        &self,
        mut change: impl FnMut(&mut PrState) -> Result<(), Sense>,
    ) -> Option<Result<(), Sense>> {
        let store = self.cfg.pr_store.as_ref()?;
        let _one = self.pr_out_lock.lock();
        for _ in 0..STORE_ATTEMPTS {
            let (text, version) = match store.load() {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("SPC-2 reservation: load: {e}");
                    return None;
                }
            };
            let base = parse(text.as_deref())?;
            let mut work = base.clone();
            if let Err(s) = change(&mut work) {
                self.pr.install_state(base, version);
                return Some(Err(s));
            }
            let new_text = work.to_shared_text_with_legacy();
            if text.is_some() && new_text == base.to_shared_text_with_legacy() {
                self.pr.install_state(base, version);
                return Some(Ok(()));
            }
            match store.store_if(version, &new_text) {
                Ok(StoreResult::Conflict) => continue,
                Ok(StoreResult::Stored(v)) => {
                    self.pr.install_state(work, v);
                    // The other gateways check commands against their own copy: they must
                    // have the new holder before this RESERVE or RELEASE completes.
                    if let Err(e) = store.announce(v, &new_text) {
                        tracing::warn!(
                            "SPC-2 reservation change {v} stored, but not every gateway \
                             acknowledged it: {e}"
                        );
                    }
                    return Some(Ok(()));
                }
                Err(e) => {
                    tracing::warn!("SPC-2 reservation: store: {e}");
                    return None;
                }
            }
        }
        None
    }

    /// Sends unit attentions to the other targets of this logical unit (a no-op without a
    /// store that reaches them), logging a failure: the local change stands either way.
    pub(crate) fn share_attention(&self, text: &str) {
        if let Some(store) = &self.cfg.pr_store {
            if let Err(e) = store.notify(text) {
                tracing::warn!("unit attention not delivered to the other node: {e}");
            }
        }
    }

    /// LOGICAL UNIT RESET: its unit attention (29/03) for the nexuses of the other targets of
    /// this logical unit too. Blocks until they have it: call off the event loop, after
    /// [`LogicalUnit::lun_reset`].
    pub fn share_lun_reset(&self) {
        self.share_reset(0x03);
    }

    /// TARGET WARM (or COLD) RESET: as [`LogicalUnit::share_lun_reset`], with 29/02 (29/01).
    pub fn share_target_reset(&self, cold: bool) {
        self.share_reset(if cold { 0x01 } else { 0x02 });
    }

    fn share_reset(&self, ascq: u8) {
        if self.shares_legacy() && self.pr.read().legacy_holder.is_some() {
            self.change_legacy(|st| {
                st.legacy_holder = None;
                Ok(())
            });
        }
        self.share_attention(&attention_text(0x29, ascq, None));
    }

    /// Reads the store's latest state into the logical unit.
    pub(crate) fn refresh_pr(&self) -> io::Result<()> {
        let Some(store) = &self.cfg.pr_store else {
            return Ok(());
        };
        let (text, version) = store.load()?;
        let st = parse(text.as_deref()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "unparsable reservation state")
        })?;
        self.pr.install_state(st, version);
        Ok(())
    }

    /// PERSISTENT RESERVE OUT against the shared store: load, apply, compare-and-set, and on
    /// success announce to every gateway before completing.
    pub(crate) fn pr_out_shared(
        &self,
        store: &dyn PrStore,
        req: &ScsiRequest<'_>,
        p: &OutParams,
    ) -> Result<(), PrError> {
        // One change at a time from this gateway; the state lock itself is held only briefly,
        // so announcements from other gateways are taken while this one waits on the store.
        let _one = self.pr_out_lock.lock();
        // A store this port cannot reach now (a replica that lost its peer and its epoch:
        // `NotConnected`) answers as the data path does, NOT READY, TARGET PORT IN UNAVAILABLE
        // STATE, which hosts retry on another path; any other failure is the target's own.
        let failed = |what: &str, e: io::Error| {
            tracing::warn!("persistent reservation {what}: {e}");
            PrError::Sense(Sense::device(&e, Sense::internal_failure()))
        };
        for _ in 0..STORE_ATTEMPTS {
            let (text, version) = store.load().map_err(|e| failed("load", e))?;
            let base = parse(text.as_deref()).ok_or_else(|| {
                failed(
                    "load",
                    io::Error::new(io::ErrorKind::InvalidData, "unparsable state"),
                )
            })?;
            self.pr.install_state(base.clone(), version);
            let shares_legacy = self.shares_legacy();
            let mut work = if shares_legacy {
                base.clone()
            } else {
                PrState {
                    legacy_holder: self.pr.read().legacy_holder.clone(),
                    ..base.clone()
                }
            };
            let mut uas: Vec<UaIntent> = Vec::new();
            self.pr_apply(&mut work, req, p, &mut uas)?;
            let text_of = |st: &PrState| {
                if shares_legacy {
                    st.to_shared_text_with_legacy()
                } else {
                    st.to_shared_text()
                }
            };
            let new_text = text_of(&work);
            if text.is_some() && new_text == text_of(&base) {
                return Ok(());
            }
            match store
                .store_if(version, &new_text)
                .map_err(|e| failed("store", e))?
            {
                StoreResult::Conflict => continue,
                StoreResult::Stored(new_version) => {
                    self.pr.install_state(work, new_version);
                    self.raise_pr_uas(uas);
                    if let Err(e) = store.announce(new_version, &new_text) {
                        tracing::warn!(
                            "persistent reservation change {new_version} stored, but not \
                             every gateway acknowledged it: {e}"
                        );
                    }
                    return Ok(());
                }
            }
        }
        tracing::warn!("persistent reservation: {STORE_ATTEMPTS} attempts lost to other gateways");
        Err(PrError::Sense(Sense::internal_failure()))
    }
}

/// Unit attentions as text for the other targets: `ua ASC ASCQ` (hex), then `all`, or the
/// registrations (as in the state text) whose nexuses get it.
pub(crate) fn attention_text(
    asc: u8,
    ascq: u8,
    regs: Option<&[crate::pr::Registration]>,
) -> String {
    let mut s = format!("ua {asc:02x} {ascq:02x}\n");
    match regs {
        None => s.push_str("all\n"),
        Some(regs) => {
            for r in regs {
                s.push_str(&format!("reg {}\n", PrState::reg_line(r)));
            }
        }
    }
    s
}

/// Raises the unit attentions of [`attention_text`] on the matching nexuses; malformed text
/// raises nothing.
pub(crate) fn raise_attention_text(ua: &crate::ua::UnitAttentions, text: &str) {
    let mut lines = text.lines();
    let Some(head) = lines.next() else { return };
    let words: Vec<&str> = head.split(' ').collect();
    let ["ua", asc, ascq] = words.as_slice() else {
        tracing::warn!("unparsable unit attention from the other node");
        return;
    };
    let (Ok(asc), Ok(ascq)) = (u8::from_str_radix(asc, 16), u8::from_str_radix(ascq, 16)) else {
        tracing::warn!("unparsable unit attention from the other node");
        return;
    };
    let mut all = false;
    let mut regs = Vec::new();
    for line in lines {
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["all"] => all = true,
            ["reg", rest @ ..] => match PrState::parse_reg(rest) {
                Some(r) => regs.push(r),
                None => return,
            },
            _ => return,
        }
    }
    if all {
        ua.raise_all(asc, ascq, None);
    } else {
        ua.raise_where(asc, ascq, |_, who| regs.iter().any(|r| r.matches(who)));
    }
}
