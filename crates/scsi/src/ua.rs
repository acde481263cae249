//! Unit attention conditions (SAM-5 5.14): a queue per I_T nexus, reported once then cleared.
//!
//! A counter of queued conditions lets commands skip the lock entirely when nothing is pending,
//! which is the normal case.

use crate::sense::Sense;
use crate::Nexus;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Who a nexus is, for matching against reservation registrations.
#[derive(Debug, Clone)]
pub(crate) struct NexusIdentity {
    pub name: Arc<str>,
    pub isid: [u8; 6],
    pub rel_port: u16,
}

impl NexusIdentity {
    pub fn of(n: &Nexus) -> Self {
        Self {
            name: n.initiator_name.clone(),
            isid: n.isid,
            rel_port: n.relative_target_port,
        }
    }
}

struct Slot {
    who: NexusIdentity,
    queue: VecDeque<(u8, u8)>,
}

/// Pending unit attentions of one logical unit, by nexus id.
#[derive(Default)]
pub(crate) struct UnitAttentions {
    pending: AtomicUsize,
    slots: Mutex<HashMap<u64, Slot>>,
}

/// At most this many conditions queue per nexus; older ones are dropped (SAM-5 allows
/// reporting only the highest-priority one).
const MAX_QUEUED: usize = 8;

impl UnitAttentions {
    /// Registers a nexus, optionally with an initial condition (e.g. power on).
    pub fn add(&self, n: &Nexus, initial: Option<(u8, u8)>) {
        let mut slots = self.slots.lock();
        let slot = slots.entry(n.id).or_insert_with(|| Slot {
            who: NexusIdentity::of(n),
            queue: VecDeque::new(),
        });
        if let Some(c) = initial {
            slot.queue.push_back(c);
            self.pending.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Ensures a nexus is known without queuing anything (cheap when it already is).
    pub fn ensure(&self, n: &Nexus) {
        let mut slots = self.slots.lock();
        slots.entry(n.id).or_insert_with(|| Slot {
            who: NexusIdentity::of(n),
            queue: VecDeque::new(),
        });
    }

    /// Forgets a nexus and its conditions.
    pub fn remove(&self, id: u64) {
        if let Some(slot) = self.slots.lock().remove(&id) {
            self.pending.fetch_sub(slot.queue.len(), Ordering::AcqRel);
        }
    }

    fn push(&self, slot: &mut Slot, c: (u8, u8)) {
        if slot.queue.contains(&c) {
            return;
        }
        if slot.queue.len() >= MAX_QUEUED {
            slot.queue.pop_front();
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
        slot.queue.push_back(c);
        self.pending.fetch_add(1, Ordering::AcqRel);
    }

    /// Queues `(asc, ascq)` on every nexus accepted by `filter`.
    pub fn raise_where(
        &self,
        asc: u8,
        ascq: u8,
        mut filter: impl FnMut(u64, &NexusIdentity) -> bool,
    ) {
        let mut slots = self.slots.lock();
        for (id, slot) in slots.iter_mut() {
            if filter(*id, &slot.who) {
                self.push(slot, (asc, ascq));
            }
        }
    }

    /// Queues on every nexus except `except`.
    pub fn raise_all(&self, asc: u8, ascq: u8, except: Option<u64>) {
        self.raise_where(asc, ascq, |id, _| Some(id) != except);
    }

    /// Removes `(asc, ascq)` from the queue of nexus `id`, if queued.
    pub fn clear(&self, id: u64, asc: u8, ascq: u8) {
        if self.pending.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut slots = self.slots.lock();
        if let Some(slot) = slots.get_mut(&id) {
            let before = slot.queue.len();
            slot.queue.retain(|c| *c != (asc, ascq));
            self.pending
                .fetch_sub(before - slot.queue.len(), Ordering::AcqRel);
        }
    }

    /// Whether any nexus has a condition queued (one atomic load).
    pub fn any_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire) != 0
    }

    /// Takes the oldest pending condition of a nexus.
    pub fn take(&self, id: u64) -> Option<Sense> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut slots = self.slots.lock();
        let (asc, ascq) = slots.get_mut(&id)?.queue.pop_front()?;
        self.pending.fetch_sub(1, Ordering::AcqRel);
        Some(Sense::unit_attention(asc, ascq))
    }
}
