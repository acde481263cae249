//! The peer connection: handshake start, message intake, heartbeats, losing the peer, and the
//! race for the epoch.

use super::ops::{Kind, PeerSide, Phase};
use super::{channel_index, Link, Replica, State};
use crate::action::{Action, Event, HostError};
use crate::config::Nanos;
use crate::epoch::RaceOutcome;
use crate::meta::{self, fresh_generation, MetaOp};
use crate::wire::{Bitmap, BitmapEnd, Body, Heartbeat, HeartbeatAck, Message, Suspect};

/// Words per `Bitmap` message.
const BITMAP_CHUNK: usize = 512;

impl Replica {
    /// Both peer connections are up (a new connection: sequence numbers start again).
    pub fn peer_connected(&mut self, now: Nanos) {
        if self.link != Link::Down {
            self.lose_peer(now);
        }
        if matches!(self.state, State::Suspended { racing: true, .. }) {
            // The race decides first; the driver connects again later.
            self.actions.push_back(Action::DropPeerConnection);
            return;
        }
        self.session += 1;
        self.send_seq = [0; 2];
        self.recv_seq = [0; 2];
        self.acks_waiting.clear();
        self.last_heard = now;
        self.next_heartbeat = now;
        self.link = Link::Handshake {
            hello: None,
            bits: vec![0; self.bitmap.len()],
            suspect: vec![0; self.bitmap.len()],
        };
        // Writes queued while suspended would be dirtied after our bitmap is sent: refuse.
        if matches!(self.state, State::Suspended { .. }) {
            for _ in 0..self.unadmitted.len() {
                if let Some(slot) = self.unadmitted.pop_front() {
                    self.unadmitted.push_back(slot);
                    if self
                        .ops
                        .get(slot)
                        .is_some_and(|o| o.peer == PeerSide::None && !o.retry)
                    {
                        self.fail_own(slot, HostError::NotReady);
                    }
                }
            }
        }
        let hello = self.my_hello();
        self.send(Body::Hello(hello));
        let words = self.bitmap.len();
        let mut first = 0;
        while first < words {
            let n = BITMAP_CHUNK.min(words - first);
            if self.bitmap[first..first + n].iter().any(|&w| w != 0) {
                let words = self.bitmap[first..first + n].to_vec();
                self.send(Body::Bitmap(Bitmap {
                    first_word: first as u64,
                    words,
                }));
            }
            first += n;
        }
        let mut first = 0;
        while first < words {
            let n = BITMAP_CHUNK.min(words - first);
            if self.suspect[first..first + n].iter().any(|&w| w != 0) {
                let words = self.suspect[first..first + n].to_vec();
                self.send(Body::Suspect(Suspect {
                    first_word: first as u64,
                    words,
                }));
            }
            first += n;
        }
        let set_bits = meta::count_set(&self.bitmap);
        self.send(Body::BitmapEnd(BitmapEnd { set_bits }));
        self.pump(now);
    }

    /// The peer connection is gone (either channel).
    pub fn peer_disconnected(&mut self, now: Nanos) {
        self.lose_peer(now);
        self.pump(now);
    }

    /// Close the connection from our side.
    pub(super) fn drop_peer(&mut self, now: Nanos) {
        if self.link != Link::Down {
            self.actions.push_back(Action::DropPeerConnection);
            self.lose_peer(now);
        }
    }

    /// A message from the peer (decoded by the driver with [`crate::codec::decode`]).
    pub fn receive(&mut self, now: Nanos, msg: Message) {
        let name = msg.body.name();
        if self.link == Link::Down {
            self.refuse(name, "not connected");
            return;
        }
        if msg.header.node != self.peer() {
            self.refuse_and_drop(now, name, "wrong node");
            return;
        }
        let c = channel_index(msg.body.channel());
        if msg.header.seq <= self.recv_seq[c] {
            self.stats.duplicates += 1;
            self.refuse(name, "duplicate");
            return;
        }
        if msg.header.seq != self.recv_seq[c] + 1 {
            self.refuse_and_drop(now, name, "sequence gap");
            return;
        }
        self.recv_seq[c] = msg.header.seq;
        self.last_heard = now;
        let handshake_msg = matches!(
            msg.body,
            Body::Hello(_) | Body::Bitmap(_) | Body::Suspect(_) | Body::BitmapEnd(_)
        );
        let heartbeat = matches!(msg.body, Body::Heartbeat(_) | Body::HeartbeatAck(_));
        match self.link {
            Link::Handshake { .. } if !handshake_msg && !heartbeat => {
                self.refuse_and_drop(now, name, "during handshake");
                return;
            }
            Link::Up if handshake_msg => {
                self.refuse_and_drop(now, name, "after handshake");
                return;
            }
            Link::Up if msg.header.epoch < self.epoch => {
                // From before the peer learned the session epoch (heartbeats) or stale.
                self.stats.stale_epoch += 1;
                self.refuse(name, "stale epoch");
                return;
            }
            Link::Up if msg.header.epoch > self.epoch => {
                self.refuse_and_drop(now, name, "newer epoch");
                return;
            }
            _ => {}
        }
        match msg.body {
            Body::Hello(h) => self.on_hello(now, msg.header.epoch, h),
            Body::Bitmap(b) => self.on_bitmap(now, b.first_word, b.words, false),
            Body::Suspect(b) => self.on_bitmap(now, b.first_word, b.words, true),
            Body::BitmapEnd(b) => self.on_bitmap_end(now, b),
            Body::Write(w) => self.on_write(now, w),
            Body::WriteAck(a) => self.on_write_ack(now, a),
            Body::Heartbeat(h) => self.send(Body::HeartbeatAck(HeartbeatAck { echo: h.sent_at })),
            Body::HeartbeatAck(h) => {
                // A peer that answered a heartbeat races for the epoch no sooner than a failure
                // timeout after it last heard from us, so until `echo + read_lease` nothing can
                // be acknowledged without this node. Only counted once this node has pairs'
                // data (paired, or sync source); a handshake gives no lease.
                if matches!(
                    self.state,
                    State::Paired { .. } | State::ResyncSource { .. }
                ) && self.link == Link::Up
                    && h.echo <= now
                {
                    self.lease_until = self.lease_until.max(h.echo + self.cfg.read_lease);
                }
            }
            Body::Flush(f) => self.on_peer_flush(now, f),
            Body::FlushAck(f) => self.on_flush_ack(now, f),
            Body::ResyncData(d) => self.on_resync_data(now, d),
            Body::ResyncAck(a) => self.on_resync_ack(now, a),
            Body::ResyncSums(d) => self.on_resync_sums(now, d),
            Body::ResyncDiffer(d) => self.on_resync_differ(now, d),
            Body::ResyncDone(d) => self.on_resync_done(now, d),
            Body::Shared(m) => self.on_shared(now, m),
            Body::SharedAck(a) => self.on_shared_ack(now, a),
            Body::Caw(c) => self.on_caw(now, c),
            Body::CawResult(r) => self.on_caw_result(now, r),
        }
    }

    /// Timers: heartbeats, failure detection, races.
    pub fn tick(&mut self, now: Nanos) {
        if self.link != Link::Down {
            if now.saturating_sub(self.last_heard) > self.cfg.failure_timeout() {
                self.event(Event::PeerSilent);
                self.drop_peer(now);
            } else if now >= self.next_heartbeat {
                self.send(Body::Heartbeat(Heartbeat { sent_at: now }));
                self.next_heartbeat = now + self.cfg.heartbeat_interval;
            }
        }
        if self.link == Link::Up
            && self.resyncing()
            && now.saturating_sub(self.resync_moved) > self.cfg.resync_stall
        {
            self.stats.resync_stalls += 1;
            let inflight = self.describe_inflight();
            self.event(Event::ResyncStalled { inflight });
            self.drop_peer(now);
        }
        if let State::Suspended {
            race_at,
            racing: false,
            serving,
        } = self.state
        {
            if self.link == Link::Down && now >= race_at {
                if self.outdated {
                    self.set_state(State::Outdated);
                } else {
                    self.state = State::Suspended {
                        serving,
                        race_at,
                        racing: true,
                    };
                    self.actions.push_back(Action::RaceForEpoch);
                }
            }
        }
        if self.in_sync_due.is_some_and(|t| now >= t) {
            self.in_sync_due = None;
            let epoch = self.epoch;
            self.actions.push_back(Action::MarkInSync { epoch });
        }
        self.pump(now);
    }

    /// The earliest time `tick` has something to do (the driver may tick more often).
    pub fn next_timer(&self) -> Option<Nanos> {
        let mut t: Option<Nanos> = None;
        let mut at = |x: Nanos| t = Some(t.map_or(x, |t| t.min(x)));
        if self.link != Link::Down {
            at(self.next_heartbeat);
            at(self.last_heard + self.cfg.failure_timeout() + 1);
        }
        if let State::Suspended {
            race_at,
            racing: false,
            ..
        } = self.state
        {
            at(race_at);
        }
        if let Some(d) = self.in_sync_due {
            at(d);
        }
        if self.link == Link::Up && self.resyncing() {
            at(self.resync_moved + self.cfg.resync_stall + 1);
        }
        t
    }

    /// A resync is under way (either side).
    fn resyncing(&self) -> bool {
        matches!(
            self.state,
            State::ResyncSource { .. } | State::ResyncTarget { .. }
        )
    }

    /// The peer is gone: every write it has not confirmed becomes dirty, and the state moves on.
    pub(super) fn lose_peer(&mut self, now: Nanos) {
        if self.link == Link::Down {
            return;
        }
        self.link = Link::Down;
        self.acks_waiting.clear();
        self.in_sync_due = None;
        self.stats.peer_lost += 1;
        self.event(Event::PeerLost);
        self.caws_peer_lost();
        let next = match &self.state {
            State::Paired { .. }
            | State::ResyncSource {
                holds_epoch: false, ..
            } => {
                let delay = if self.cfg.node == self.cfg.preferred {
                    0
                } else {
                    self.cfg.tie_delay
                };
                // Not before a failure timeout since the peer was last heard: until then it may
                // still serve reads under its lease.
                let race_at = now.max(self.last_heard + self.cfg.failure_timeout()) + delay;
                Some(State::Suspended {
                    serving: true,
                    race_at,
                    racing: false,
                })
            }
            State::ResyncSource {
                holds_epoch: true, ..
            } => Some(State::Alone { epoch: self.epoch }),
            State::ResyncTarget { .. } => Some(State::Outdated),
            State::Suspended {
                serving,
                race_at,
                racing,
            } => {
                // Lost during a handshake: the peer may have served reads under a lease.
                let (serving, racing) = (*serving, *racing);
                let delay = if self.cfg.node == self.cfg.preferred {
                    0
                } else {
                    self.cfg.tie_delay
                };
                let earliest = now.max(self.last_heard + self.cfg.failure_timeout()) + delay;
                let race_at = if *race_at == Nanos::MAX {
                    Nanos::MAX
                } else {
                    (*race_at).max(earliest)
                };
                self.state = State::Suspended {
                    serving,
                    race_at,
                    racing,
                };
                None
            }
            State::Alone { .. } | State::Outdated => None,
        };
        let Some(next) = next else { return };
        let side = match next {
            State::Alone { .. } => PeerSide::Local,
            _ => PeerSide::Held,
        };
        let target = matches!(next, State::Outdated);
        for slot in 0..self.ops.len() as u32 {
            let Some(op) = self.ops.get_mut(slot) else {
                continue;
            };
            if !matches!(op.kind, Kind::Own { .. }) {
                continue;
            }
            op.retry = false;
            if op.phase == Phase::Unadmitted {
                continue;
            }
            if matches!(op.peer, PeerSide::Sent | PeerSide::Held) {
                op.peer = if target { PeerSide::None } else { side };
                let (lba, blocks, applied_at) = (op.lba, op.blocks, op.applied_at);
                // The dirty bits (journaled before any later eviction) now cover it.
                if op.phase == Phase::Done && op.al.take().is_some() {
                    let (e0, e1) = self.al.extents(lba, blocks);
                    self.al.release(e0, e1, applied_at, true);
                }
                self.mark_dirty(lba, blocks);
                if target {
                    self.fail_own(slot, HostError::Fenced);
                } else {
                    self.maybe_finish_own(slot);
                }
            }
        }
        self.flushes_peer_lost(side, target);
        self.shared_peer_lost(side, target);
        self.set_state(next);
    }

    /// How the race for the epoch ended.
    pub fn race_result(&mut self, now: Nanos, outcome: RaceOutcome) {
        let State::Suspended {
            serving,
            race_at,
            racing: true,
        } = self.state
        else {
            self.event(Event::Refused {
                message: "race result",
                reason: "no race open",
                drops_link: false,
            });
            return;
        };
        match outcome {
            RaceOutcome::Won { epoch } => {
                self.epoch = epoch;
                self.gens
                    .start_alone(fresh_generation(epoch, self.cfg.node));
                self.persist(MetaOp::Gens(self.gens));
                self.alone_token = self.persist(MetaOp::State {
                    epoch,
                    outdated: false,
                });
                self.set_state(State::Alone { epoch });
                self.release_held(PeerSide::Local);
            }
            RaceOutcome::Lost { epoch } => {
                self.epoch = self.epoch.max(epoch);
                self.outdated = true;
                self.persist(MetaOp::State {
                    epoch: self.epoch,
                    outdated: true,
                });
                self.set_state(State::Outdated);
                self.fail_held();
            }
            RaceOutcome::Unreachable => {
                let _ = race_at;
                self.state = State::Suspended {
                    serving,
                    race_at: now + self.cfg.race_retry,
                    racing: false,
                };
            }
        }
        self.pump(now);
    }

    /// Operator override: a node that started from disk while paired waits for its peer rather
    /// than race (its disk may lack writes the peer acknowledged before a power loss). If the
    /// peer is known to be gone for good, this lets it race for the epoch now.
    pub fn force_race(&mut self, now: Nanos) {
        if let State::Suspended {
            serving,
            racing: false,
            ..
        } = self.state
        {
            self.state = State::Suspended {
                serving,
                race_at: now,
                racing: false,
            };
            self.tick(now);
        }
    }

    /// Whether the store accepted `MarkInSync` (retried on the next tick if not).
    pub fn in_sync_result(&mut self, now: Nanos, ok: bool) {
        if !ok && matches!(self.state, State::Paired { .. }) {
            self.in_sync_due = Some(now + self.cfg.race_retry);
        }
    }

    /// Held writes and flushes may complete with `side` (Local: alone; Acked: the peer has it).
    pub(super) fn release_held(&mut self, side: PeerSide) {
        for slot in 0..self.ops.len() as u32 {
            if let Some(op) = self.ops.get_mut(slot) {
                if op.peer == PeerSide::Held {
                    op.peer = side;
                    self.maybe_finish_own(slot);
                }
            }
        }
        self.flushes_release_held(side);
        if side == PeerSide::Local {
            self.shared_release_held();
        }
    }

    /// Held writes and flushes fail: this node is fenced.
    pub(super) fn fail_held(&mut self) {
        for slot in 0..self.ops.len() as u32 {
            if self.ops.get(slot).is_some_and(|o| {
                o.peer == PeerSide::Held
                    || (o.phase == Phase::Unadmitted && matches!(o.kind, Kind::Own { .. }))
            }) {
                self.fail_own(slot, HostError::Fenced);
            }
        }
        self.flushes_fail_held();
        self.shared_fail_held();
    }
}
