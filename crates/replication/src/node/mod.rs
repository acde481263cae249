//! The replica state machine: one LUN on one node.
//!
//! Every input is a method call carrying the current time; every output is an [`Action`]
//! drained with [`Replica::poll_action`]. See `docs/REPLICATION.md` for the protocol, and the
//! submodules for each part: [`write`] (the write path and overlap ordering), [`link`]
//! (connection, heartbeats, fencing), [`resync`] (handshake and resync), [`flush`] (flushes,
//! fsyncs, aborts).
//!
//! # States
//!
//! ```text
//!             start (outdated on disk) ──────────────────────────────┐
//!   start ─▶ Suspended{serving:false} ─ race won ─▶ Alone ◀─ lost ┐   ▼
//!               │  │   peer lost        ▲   race won   │ ResyncSource{holds}
//!               │  │  ┌──── Paired ─────┼──▶ Suspended │   │  │ peer lost
//!               │  │  │    ▲      ▲     │    │ │ race lost  │  ▼
//!               │  │  │    │ done │done │    │ └────────▶ Outdated ◀── peer lost ─┐
//!     handshake │  └──┼────┼──────┼─────┼────┘handshake       │ handshake        │
//!               ▼     │ ResyncSource  ResyncTarget ◀──────────┘              ResyncTarget
//! ```
//!
//! In words: a started node waits for its peer or, after the failure timeout, races for the
//! epoch. Paired nodes both serve. A node that loses its peer suspends acknowledgements and
//! races; the winner goes on `Alone` (dirty tracking), the loser is `Outdated` (unavailable)
//! until it has been resynced. Every connection starts with a handshake that picks the sync
//! source; the pair is `Paired` again once the source has copied every dirty region.

mod caw;
mod flush;
mod link;
mod ops;
mod resync;
mod shared;
mod write;

use std::collections::VecDeque;

use crate::action::{Action, Alua, Event, Token};
use crate::al::ActivityLog;
use crate::config::{Config, ConfigError, Nanos};
use crate::intervals::Intervals;
use crate::meta::{self, Generations, Meta, MetaOp};
use crate::wire::{Body, Channel, Header, Message, NodeId};

pub use resync::{block_sums, decide, Decision, SUM_BYTES};

use ops::Slab;

/// The replica's state; each variant carries its own data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// No peer and no epoch: acknowledgements wait (`serving`: this node was serving before,
    /// so its port groups stay active) until the race for the epoch or a handshake decides.
    Suspended {
        serving: bool,
        race_at: Nanos,
        racing: bool,
    },
    /// Connected and in sync; `leader` orders concurrent overlapping writes.
    Paired { leader: NodeId },
    /// Holds `epoch` without the peer: acknowledges alone, tracks dirty regions.
    Alone { epoch: u64 },
    /// Lost the epoch (or an unfinished resync target): serves nothing until resynced.
    Outdated,
    /// Connected, copying dirty regions to the peer while serving. `holds_epoch`: this node
    /// was alone (on losing the peer again it goes back to `Alone` without a race).
    ResyncSource {
        holds_epoch: bool,
        sync: resync::SourceSync,
    },
    /// Connected, receiving resync from `leader`; serves nothing.
    ResyncTarget { leader: NodeId },
}

impl State {
    /// Short name, for events.
    pub fn name(&self) -> &'static str {
        match self {
            State::Suspended { .. } => "Suspended",
            State::Paired { .. } => "Paired",
            State::Alone { .. } => "Alone",
            State::Outdated => "Outdated",
            State::ResyncSource { .. } => "ResyncSource",
            State::ResyncTarget { .. } => "ResyncTarget",
        }
    }

    fn alua(&self) -> Alua {
        match self {
            State::Suspended { serving: false, .. } | State::ResyncTarget { .. } => {
                Alua::Transitioning
            }
            State::Outdated => Alua::Unavailable,
            _ => Alua::ActiveOptimized,
        }
    }
}

/// The peer connection.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    Down,
    /// Connected; exchanging `Hello` and bitmaps.
    Handshake {
        hello: Option<crate::wire::Hello>,
        bits: Vec<u64>,
        /// The peer's suspect regions (`Suspect`).
        suspect: Vec<u64>,
    },
    Up,
}

/// Counters of what the core refused or resolved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub refused: u64,
    pub stale_epoch: u64,
    pub duplicates: u64,
    pub superseded: u64,
    pub retried: u64,
    pub peer_lost: u64,
    pub resync_regions: u64,
    /// Blocks whose data this node sent as sync source (whole dirty regions, and suspect
    /// blocks whose checksums differed).
    pub resync_blocks: u64,
    /// Suspect blocks this node compared by checksum as sync source (8 bytes each sent).
    pub resync_compared_blocks: u64,
    /// Resync chunks that found every operation slot taken and waited for a later step.
    pub resync_deferred: u64,
    /// Resyncs that moved nothing for `Config::resync_stall` and were started again.
    pub resync_stalls: u64,
    /// Blocks this node applied as sync target.
    pub resync_applied_blocks: u64,
    pub full_resyncs: u64,
    /// COMPARE AND WRITEs this node executed (compared), and forwarded to the leader.
    pub caws: u64,
    pub caws_forwarded: u64,
}

/// One LUN's replica on one node.
pub struct Replica {
    cfg: Config,
    state: State,
    link: Link,
    actions: VecDeque<Action>,
    // Persistent state, mirrored in memory.
    gens: Generations,
    epoch: u64,
    outdated: bool,
    bitmap: Vec<u64>,
    /// In memory only, a subset of `bitmap`: regions set only because they lay in an
    /// activity-log extent at start (after a crash), never written since. They may differ
    /// from the peer or not, so resync compares them by checksum instead of copying them. A
    /// second crash before the resync turns them into plain dirty regions (the bitmap is
    /// durable, this is not): copied whole, which is safe.
    suspect: Vec<u64>,
    // Journal.
    journal: Token,
    persisted: Token,
    /// Acknowledging alone needs the journal through this token (the new generation).
    alone_token: Token,
    // Operations.
    ops: Slab,
    set: Intervals,
    unadmitted: VecDeque<u32>,
    next_order: u64,
    al: ActivityLog,
    applied: u64,
    host_writes: usize,
    scratch: Vec<(u64, u64)>,
    // Replication.
    next_wseq: u64,
    last_sent_wseq: u64,
    last_peer_wseq: u64,
    acks_waiting: VecDeque<crate::wire::WriteAck>,
    /// Wire id of the last CAW forwarded to the leader.
    next_caw: u64,
    // Link.
    session: u64,
    peer_epoch: u64,
    send_seq: [u64; 2],
    recv_seq: [u64; 2],
    last_heard: Nanos,
    /// When the resync under way last moved (see `Config::resync_stall`).
    resync_moved: Nanos,
    next_heartbeat: Nanos,
    lease_until: Nanos,
    in_sync_due: Option<Nanos>,
    // Flushes, fsyncs, aborts.
    flushes: Vec<flush::FlushOp>,
    next_flush: u64,
    fsyncs: Vec<flush::FsyncOp>,
    next_fsync: Token,
    aborts: Vec<(u64, crate::action::AbortScope)>,
    /// Shared SCSI state (persistent reservations) and its changes in flight.
    shared: shared::SharedState,
    stats: Stats,
}

impl Replica {
    /// Start from the persisted metadata. Whatever the activity log holds may differ from the
    /// peer (writes in flight at a crash), so it is merged into the dirty bitmap first.
    pub fn new(cfg: Config, meta: Meta, now: Nanos) -> Result<Replica, ConfigError> {
        cfg.validate()?;
        let regions = cfg.regions();
        let words = meta::words_for(regions);
        let slab = 2 * cfg.max_inflight + cfg.resync_window + 4;
        let mut bitmap = meta.bitmap.clone();
        bitmap.resize(words, 0);
        let mut r = Replica {
            state: State::Suspended {
                serving: false,
                race_at: now + cfg.failure_timeout(),
                racing: false,
            },
            link: Link::Down,
            actions: VecDeque::with_capacity(64),
            gens: meta.gens,
            epoch: meta.epoch,
            outdated: meta.outdated,
            suspect: vec![0; bitmap.len()],
            bitmap,
            journal: 0,
            persisted: 0,
            alone_token: 0,
            ops: Slab::new(slab),
            set: Intervals::with_capacity(slab),
            unadmitted: VecDeque::with_capacity(cfg.max_inflight),
            next_order: 1,
            al: ActivityLog::new(cfg.al_slots, cfg.al_extent_blocks),
            applied: 0,
            host_writes: 0,
            scratch: Vec::with_capacity(16),
            next_wseq: 1,
            last_sent_wseq: 0,
            last_peer_wseq: 0,
            acks_waiting: VecDeque::with_capacity(slab),
            next_caw: 0,
            session: 0,
            peer_epoch: 0,
            send_seq: [0; 2],
            recv_seq: [0; 2],
            last_heard: now,
            resync_moved: now,
            next_heartbeat: now,
            lease_until: 0,
            in_sync_due: None,
            flushes: Vec::with_capacity(8),
            next_flush: 1,
            fsyncs: Vec::with_capacity(8),
            next_fsync: 1,
            aborts: Vec::new(),
            shared: Default::default(),
            stats: Stats::default(),
            cfg,
        };
        let per_extent = r.cfg.al_extent_blocks / u64::from(r.cfg.region_blocks);
        for (slot, extent) in meta.al.iter().enumerate() {
            if let Some(e) = *extent {
                let (first, count) = (e * per_extent, per_extent);
                let count = count.min(r.cfg.regions().saturating_sub(first));
                let mut suspect = Vec::new();
                for i in first..first + count {
                    if !meta::get_bit(&r.bitmap, i) {
                        suspect.push(i);
                    }
                }
                r.mark_regions(first, count);
                for i in suspect {
                    meta::set_range(&mut r.suspect, i, 1, true);
                }
                r.persist(MetaOp::AlSet {
                    slot: slot as u32,
                    extent: None,
                });
            }
        }
        if r.outdated {
            r.state = State::Outdated;
        } else if r.gens.bitmap == 0 {
            // Paired when it stopped: the peer may hold acknowledged writes this disk lost, so
            // wait for it (or for `force_race`). A node that held the epoch alone (an open
            // bitmap generation) had the only current copy and may race.
            r.state = State::Suspended {
                serving: false,
                race_at: Nanos::MAX,
                racing: false,
            };
        }
        let alua = r.state.alua();
        r.actions.push_back(Action::SetAlua(alua));
        Ok(r)
    }

    /// The next output, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn generations(&self) -> Generations {
        self.gens
    }

    /// A one-line description of every operation in flight, for failure reports.
    pub fn describe_inflight(&self) -> String {
        let mut out = String::new();
        for s in self.ops.occupied() {
            if let Some(o) = self.ops.get(s) {
                out.push_str(&format!(
                    "[{:?} {}+{} order {} wseq {} {:?} {:?} al {:?} retry {}] ",
                    o.kind, o.lba, o.blocks, o.order, o.wseq, o.phase, o.peer, o.al, o.retry
                ));
            }
        }
        if let State::ResyncSource { sync, .. } = &self.state {
            out.push_str(&sync.describe());
            out.push(' ');
        }
        out.push_str(&format!(
            "persisted {}/{} acks waiting {} last peer wseq {} unadmitted {}",
            self.persisted,
            self.journal,
            self.acks_waiting.len(),
            self.last_peer_wseq,
            self.unadmitted.len()
        ));
        out
    }

    /// Dirty regions (may differ from the peer).
    pub fn dirty_regions(&self) -> u64 {
        meta::count_set(&self.bitmap)
    }

    /// Of the dirty regions, those only suspect (in an activity-log extent at a crash):
    /// resync compares them by checksum.
    pub fn suspect_regions(&self) -> u64 {
        meta::count_set(&self.suspect)
    }

    /// Whether a read starting now may be served from the local disk: this node holds the
    /// epoch alone, or its read lease (renewed by heartbeats while paired or sync source)
    /// runs.
    pub fn read_allowed(&self, now: Nanos) -> bool {
        match self.state {
            State::Alone { .. }
            | State::ResyncSource {
                holds_epoch: true, ..
            } => true,
            State::Paired { .. }
            | State::ResyncSource {
                holds_epoch: false, ..
            }
            | State::Suspended { serving: true, .. } => now < self.lease_until,
            _ => false,
        }
    }

    /// The journal is durable through `token`.
    pub fn meta_persisted(&mut self, now: Nanos, token: Token) {
        let before = self.persisted;
        self.persisted = self.persisted.max(token.min(self.journal));
        if before < self.alone_token && self.persisted >= self.alone_token {
            // Writes waiting for the new generation to be durable may be acknowledged alone.
            for slot in 0..self.ops.len() as u32 {
                if self
                    .ops
                    .get(slot)
                    .is_some_and(|o| o.peer == ops::PeerSide::Local)
                {
                    self.maybe_finish_own(slot);
                }
            }
        }
        self.pump(now);
    }

    fn peer(&self) -> NodeId {
        self.cfg.peer()
    }

    fn persist(&mut self, op: MetaOp) -> Token {
        self.journal += 1;
        self.actions.push_back(Action::Persist {
            token: self.journal,
            op,
        });
        self.journal
    }

    fn send(&mut self, body: Body) {
        let channel = body.channel();
        let c = channel_index(channel);
        self.send_seq[c] += 1;
        let header = Header {
            epoch: self.epoch,
            node: self.cfg.node,
            seq: self.send_seq[c],
        };
        self.actions.push_back(Action::Send {
            channel,
            message: Message { header, body },
        });
    }

    fn event(&mut self, e: Event) {
        self.actions.push_back(Action::Event(e));
    }

    fn refuse(&mut self, message: &'static str, reason: &'static str) {
        self.stats.refused += 1;
        self.event(Event::Refused {
            message,
            reason,
            drops_link: false,
        });
    }

    /// Refuse a message that breaks the session's rules, and close the connection for it.
    fn refuse_and_drop(&mut self, now: Nanos, message: &'static str, reason: &'static str) {
        self.stats.refused += 1;
        self.event(Event::Refused {
            message,
            reason,
            drops_link: true,
        });
        self.drop_peer(now);
    }

    fn set_state(&mut self, new: State) {
        let before = self.state.alua();
        self.state = new;
        let after = self.state.alua();
        if before != after {
            self.actions.push_back(Action::SetAlua(after));
        }
        let name = self.state.name();
        self.event(Event::State(name));
    }

    /// Mark regions `first .. first + count` dirty, persisting new bits.
    fn mark_regions(&mut self, first: u64, count: u64) {
        let count = count.min(self.cfg.regions().saturating_sub(first));
        // Written now: no longer merely suspect.
        meta::set_range(&mut self.suspect, first, count, false);
        if count > 0 && meta::any_clear(&self.bitmap, first, count) {
            meta::set_range(&mut self.bitmap, first, count, true);
            self.persist(MetaOp::BitsSet { first, count });
        }
    }

    /// Mark the regions of blocks `[lba, lba + blocks)` dirty.
    fn mark_dirty(&mut self, lba: u64, blocks: u32) {
        let rb = u64::from(self.cfg.region_blocks);
        let first = lba / rb;
        let last = (lba + u64::from(blocks.max(1)) - 1) / rb;
        self.mark_regions(first, last - first + 1);
    }

    /// Clear the regions of blocks `[lba, lba + blocks)`, persisting if any was set.
    fn clear_dirty(&mut self, lba: u64, blocks: u32) {
        let rb = u64::from(self.cfg.region_blocks);
        let first = lba / rb;
        let count = (lba + u64::from(blocks.max(1)) - 1) / rb - first + 1;
        meta::set_range(&mut self.suspect, first, count, false);
        if meta::any_set(&self.bitmap, first, count) {
            meta::set_range(&mut self.bitmap, first, count, false);
            self.persist(MetaOp::BitsClear { first, count });
        }
    }

    /// Everything that can move on after any input.
    fn pump(&mut self, now: Nanos) {
        self.admit_own();
        self.start_ready();
        self.resync_step();
        self.finish_flushes();
        self.check_aborts();
        let _ = now;
    }
}

fn channel_index(c: Channel) -> usize {
    match c {
        Channel::Data => 0,
        Channel::Control => 1,
    }
}
