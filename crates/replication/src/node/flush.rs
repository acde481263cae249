//! Host flushes, peer flushes, local fsyncs and task-management aborts.

use super::ops::{Kind, PeerSide, Phase};
use super::resync::RESYNC_FLUSH;
use super::{Link, Replica};
use crate::action::{AbortScope, Action, HostError, Token};
use crate::config::Nanos;
use crate::wire::{Body, Flush, FlushAck};

/// A host SYNCHRONIZE CACHE in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct FlushOp {
    id: u64,
    /// Our id on the wire.
    wire: u64,
    local_done: bool,
    peer: PeerSide,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Host(u64),
    Peer { id: u64, session: u64 },
    ActivityLog,
}

/// A local fsync in flight: what it is for and the apply counter it covers.
#[derive(Debug, Clone, Copy)]
pub(super) struct FsyncOp {
    token: Token,
    covers: u64,
    purpose: Purpose,
}

impl Replica {
    fn fsync(&mut self, purpose: Purpose) {
        let token = self.next_fsync;
        self.next_fsync += 1;
        self.fsyncs.push(FsyncOp {
            token,
            covers: self.applied,
            purpose,
        });
        self.actions.push_back(Action::Fsync { token });
    }

    /// SYNCHRONIZE CACHE (and what a driver with the write cache off sends after each write):
    /// every write acknowledged before it becomes durable on both nodes (or on the one that
    /// holds the epoch alone).
    pub fn submit_flush(&mut self, now: Nanos, id: u64) {
        let peer = match self.write_mode() {
            super::write::Mode::Replicate => PeerSide::Sent,
            super::write::Mode::Local => PeerSide::Local,
            super::write::Mode::Hold => PeerSide::Held,
            super::write::Mode::Reject(e) => {
                self.actions
                    .push_back(Action::AckFlush { id, result: Err(e) });
                return;
            }
        };
        let wire = self.next_flush;
        self.next_flush += 1;
        if peer == PeerSide::Sent {
            self.send(Body::Flush(Flush { id: wire }));
        }
        self.flushes.push(FlushOp {
            id,
            wire,
            local_done: false,
            peer,
        });
        self.fsync(Purpose::Host(wire));
        self.pump(now);
    }

    pub(super) fn on_peer_flush(&mut self, now: Nanos, f: Flush) {
        let session = self.session;
        self.fsync(Purpose::Peer { id: f.id, session });
        self.pump(now);
    }

    pub(super) fn on_flush_ack(&mut self, now: Nanos, f: FlushAck) {
        if f.id == RESYNC_FLUSH {
            self.finish_source(now);
            return;
        }
        match self
            .flushes
            .iter_mut()
            .find(|x| x.wire == f.id && x.peer == PeerSide::Sent)
        {
            Some(x) => x.peer = PeerSide::Acked,
            None => self.refuse("FlushAck", "unknown flush"),
        }
        self.pump(now);
    }

    /// A local fsync finished.
    pub fn fsync_done(&mut self, now: Nanos, token: Token) {
        let Some(i) = self.fsyncs.iter().position(|f| f.token == token) else {
            return;
        };
        let f = self.fsyncs.swap_remove(i);
        self.al.synced = self.al.synced.max(f.covers);
        match f.purpose {
            Purpose::Host(wire) => {
                if let Some(x) = self.flushes.iter_mut().find(|x| x.wire == wire) {
                    x.local_done = true;
                }
            }
            Purpose::Peer { id, session } => {
                if session == self.session && self.link == Link::Up {
                    self.send(Body::FlushAck(FlushAck { id }));
                }
            }
            Purpose::ActivityLog => {}
        }
        self.pump(now);
    }

    /// The activity log needs an fsync before it can evict an extent.
    pub(super) fn request_al_sync(&mut self) {
        if self.al.needs_sync()
            && !self
                .fsyncs
                .iter()
                .any(|f| f.purpose == Purpose::ActivityLog)
        {
            self.fsync(Purpose::ActivityLog);
        }
    }

    pub(super) fn finish_flushes(&mut self) {
        let alone_ok = self.persisted >= self.alone_token;
        let mut i = 0;
        while i < self.flushes.len() {
            let f = self.flushes[i];
            let peer_ok = f.peer == PeerSide::Acked || (f.peer == PeerSide::Local && alone_ok);
            if f.local_done && peer_ok {
                self.flushes.swap_remove(i);
                self.actions.push_back(Action::AckFlush {
                    id: f.id,
                    result: Ok(()),
                });
            } else {
                i += 1;
            }
        }
    }

    pub(super) fn flushes_peer_lost(&mut self, side: PeerSide, fail: bool) {
        let mut i = 0;
        while i < self.flushes.len() {
            if matches!(self.flushes[i].peer, PeerSide::Sent | PeerSide::Held) {
                if fail {
                    let f = self.flushes.swap_remove(i);
                    self.actions.push_back(Action::AckFlush {
                        id: f.id,
                        result: Err(HostError::Fenced),
                    });
                    continue;
                }
                self.flushes[i].peer = side;
            }
            i += 1;
        }
    }

    pub(super) fn flushes_release_held(&mut self, side: PeerSide) {
        for f in &mut self.flushes {
            if f.peer == PeerSide::Held {
                f.peer = side;
            }
        }
    }

    pub(super) fn flushes_fail_held(&mut self) {
        self.flushes_peer_lost(PeerSide::None, true);
    }

    /// ABORT TASK, LUN RESET, PREEMPT AND ABORT: answered with `AbortDone { id }` once every
    /// covered write is either applied on both nodes (acknowledged) or failed. Writes not yet
    /// started anywhere are failed at once (applied on neither).
    pub fn abort(&mut self, now: Nanos, id: u64, scope: AbortScope) {
        for _ in 0..self.unadmitted.len() {
            let Some(slot) = self.unadmitted.pop_front() else {
                break;
            };
            self.unadmitted.push_back(slot);
            let covered = self.ops.get(slot).is_some_and(|o| match o.kind {
                Kind::Own { id: w } => {
                    o.is_host()
                        && o.phase == Phase::Unadmitted
                        && o.peer == PeerSide::None
                        && !o.retry
                        && covers(scope, w)
                }
                _ => false,
            });
            // A retried write was sent once: it must finish.
            if covered && self.ops.get(slot).is_some_and(|o| o.wseq == 0) {
                self.fail_own(slot, HostError::Aborted);
            }
        }
        self.aborts.push((id, scope));
        self.pump(now);
    }

    pub(super) fn check_aborts(&mut self) {
        let mut i = 0;
        while i < self.aborts.len() {
            let (id, scope) = self.aborts[i];
            let pending = self.ops.occupied().any(|s| {
                self.ops.get(s).is_some_and(|o| {
                    let id = match o.kind {
                        Kind::Own { id } | Kind::Forwarded { id } if o.is_host() => Some(id),
                        _ => None,
                    };
                    id.is_some_and(|w| covers(scope, w)) && !o.host_done
                })
            });
            if pending {
                i += 1;
            } else {
                self.aborts.swap_remove(i);
                self.actions.push_back(Action::AbortDone { id });
            }
        }
    }
}

fn covers(scope: AbortScope, id: u64) -> bool {
    match scope {
        AbortScope::Task(t) => t == id,
        AbortScope::All => true,
    }
}
