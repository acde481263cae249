//! Two replicas wired back to back in memory (every frame through the codec), checking the
//! shared-state rules: changes installed on both before they complete, concurrent changes
//! ordered by the leader, notices, and the lost-peer and resync behaviour.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::action::{Action, HostError, SharedOutcome};
use crate::config::Config;
use crate::epoch::RaceOutcome;
use crate::meta::Meta;
use crate::node::{Replica, State};
use crate::wire::Message;
use crate::{decode, encode_to_vec};

const MS: u64 = 1_000_000;

#[derive(Default)]
struct Seen {
    installed: Vec<(u64, Bytes)>,
    notices: Vec<Bytes>,
    done: Vec<(u64, Result<SharedOutcome, HostError>)>,
}

struct Pair {
    nodes: [Replica; 2],
    seen: [Seen; 2],
    /// Frames in flight to node i.
    wire: [VecDeque<Message>; 2],
    connected: bool,
    now: u64,
}

fn replica(node: u8) -> Replica {
    let cfg = Config::new(node, 0, 1024);
    let meta = Meta::new(cfg.regions(), cfg.al_slots, 1);
    Replica::new(cfg, meta, 0).unwrap()
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

impl Pair {
    fn paired() -> Pair {
        let mut p = Pair {
            nodes: [replica(0), replica(1)],
            seen: Default::default(),
            wire: Default::default(),
            connected: false,
            now: 0,
        };
        p.connect();
        assert!(matches!(p.nodes[0].state(), State::Paired { leader: 0 }));
        assert!(matches!(p.nodes[1].state(), State::Paired { leader: 0 }));
        // The handshake's snapshot: the target (node 1) took the source's (empty) state.
        assert_eq!(p.seen[1].installed, vec![(0, Bytes::new())]);
        p.seen = Default::default();
        p
    }

    fn connect(&mut self) {
        self.connected = true;
        for n in &mut self.nodes {
            n.peer_connected(self.now);
        }
        self.run();
    }

    fn cut(&mut self) {
        self.connected = false;
        self.wire = Default::default();
        for n in &mut self.nodes {
            n.peer_disconnected(self.now);
        }
        self.run();
    }

    /// Carries out every action and delivers every frame until nothing moves.
    fn run(&mut self) {
        loop {
            let mut moved = false;
            for i in 0..2 {
                while let Some(a) = self.nodes[i].poll_action() {
                    moved = true;
                    self.action(i, a);
                }
            }
            for i in 0..2 {
                if let Some(m) = self.wire[i].pop_front() {
                    moved = true;
                    self.nodes[i].receive(self.now, m);
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn action(&mut self, i: usize, a: Action) {
        let now = self.now;
        let n = &mut self.nodes[i];
        match a {
            Action::Send { message, .. } if self.connected => {
                let frame = Bytes::from(encode_to_vec(&message));
                let (back, used) = decode(&frame).unwrap().unwrap();
                assert_eq!(used, frame.len());
                self.wire[1 - i].push_back(back);
            }
            Action::Persist { token, .. } => n.meta_persisted(now, token),
            Action::Fsync { token } => n.fsync_done(now, token),
            Action::Apply { token, .. } => n.apply_done(now, token),
            Action::MarkInSync { .. } => n.in_sync_result(now, true),
            Action::SharedInstalled { version, payload } => {
                self.seen[i].installed.push((version, payload))
            }
            Action::SharedNotice { payload } => self.seen[i].notices.push(payload),
            Action::SharedDone { id, result } => self.seen[i].done.push((id, result)),
            _ => {}
        }
    }

    fn version(&self, i: usize) -> u64 {
        self.nodes[i].shared().0
    }

    fn state_of(&self, i: usize) -> Bytes {
        self.nodes[i].shared().1.clone()
    }
}

#[test]
fn a_change_is_installed_on_both_before_it_completes() {
    let mut p = Pair::paired();
    p.nodes[1].submit_shared(p.now, 7, 0, b("reserved by host A"));
    // Not complete before the peer answered.
    while let Some(a) = p.nodes[1].poll_action() {
        assert!(!matches!(a, Action::SharedDone { .. }), "{a:?}");
        p.action(1, a);
    }
    p.run();
    assert_eq!(p.seen[1].done, vec![(7, Ok(SharedOutcome::Stored(1)))]);
    // The peer installed it first (its acknowledgement is what completed the change).
    assert_eq!(p.seen[0].installed, vec![(1, b("reserved by host A"))]);
    assert_eq!(p.seen[1].installed, vec![(1, b("reserved by host A"))]);
    assert_eq!((p.version(0), p.version(1)), (1, 1));
    // A change from a stale base is refused without reaching the peer.
    p.nodes[0].submit_shared(p.now, 8, 0, b("stale"));
    p.run();
    assert_eq!(p.seen[0].done, vec![(8, Ok(SharedOutcome::Conflict))]);
    assert_eq!(p.state_of(1), b("reserved by host A"));
}

#[test]
fn concurrent_changes_are_ordered_by_the_leader() {
    let mut p = Pair::paired();
    p.nodes[0].submit_shared(p.now, 1, 0, b("leader's"));
    p.nodes[1].submit_shared(p.now, 2, 0, b("follower's"));
    p.run();
    assert_eq!(p.seen[0].done, vec![(1, Ok(SharedOutcome::Stored(1)))]);
    assert_eq!(p.seen[1].done, vec![(2, Ok(SharedOutcome::Conflict))]);
    assert_eq!(p.state_of(0), b("leader's"));
    assert_eq!(p.state_of(1), b("leader's"));
    // The follower redoes its change on the new state, and it lands on both.
    p.nodes[1].submit_shared(p.now, 3, 1, b("follower's, again"));
    p.run();
    assert_eq!(
        p.seen[1].done.last(),
        Some(&(3, Ok(SharedOutcome::Stored(2))))
    );
    assert_eq!(p.state_of(0), b("follower's, again"));
    assert_eq!(p.state_of(1), b("follower's, again"));
}

#[test]
fn notices_reach_the_peer_before_they_complete() {
    let mut p = Pair::paired();
    p.nodes[0].submit_notice(p.now, 4, b("ua 29 03 all"));
    p.run();
    assert_eq!(p.seen[1].notices, vec![b("ua 29 03 all")]);
    assert!(p.seen[0].notices.is_empty());
    assert_eq!(p.seen[0].done, vec![(4, Ok(SharedOutcome::Stored(0)))]);
    // Without a peer a notice completes at once.
    p.cut();
    p.nodes[0].submit_notice(p.now, 5, b("ua 29 03 all"));
    p.run();
    assert_eq!(
        p.seen[0].done.last(),
        Some(&(5, Ok(SharedOutcome::Stored(0))))
    );
    assert_eq!(p.seen[1].notices.len(), 1);
}

#[test]
fn a_change_held_at_peer_loss_completes_on_the_winner_and_fails_on_the_loser() {
    let mut p = Pair::paired();
    p.connected = false; // the change is sent into a dead link
    p.nodes[0].submit_shared(p.now, 1, 0, b("A's"));
    p.nodes[1].submit_shared(p.now, 2, 0, b("B's"));
    p.run();
    p.cut();
    assert!(p.seen[0].done.is_empty() && p.seen[1].done.is_empty());
    // Node 0 wins the race, node 1 loses it.
    p.now += 10 * 1000 * MS;
    for n in &mut p.nodes {
        n.tick(p.now);
    }
    p.run();
    p.nodes[0].race_result(p.now, RaceOutcome::Won { epoch: 2 });
    p.nodes[1].race_result(p.now, RaceOutcome::Lost { epoch: 2 });
    p.run();
    assert_eq!(p.seen[0].done, vec![(1, Ok(SharedOutcome::Stored(1)))]);
    assert_eq!(p.seen[1].done, vec![(2, Err(HostError::Fenced))]);
    assert_eq!(p.state_of(1), Bytes::new());
    // Alone, node 0 installs changes at once.
    p.nodes[0].submit_shared(p.now, 3, 1, b("A's, alone"));
    p.run();
    assert_eq!(
        p.seen[0].done.last(),
        Some(&(3, Ok(SharedOutcome::Stored(2))))
    );
    // Node 1 returns: the handshake makes node 0 the source, and node 1 takes its state.
    p.connect();
    assert!(matches!(p.nodes[1].state(), State::Paired { .. }));
    assert_eq!(p.seen[1].installed.last(), Some(&(2, b("A's, alone"))));
    assert_eq!((p.version(1), p.state_of(1)), (2, b("A's, alone")));
    // And changes from either node flow again.
    p.nodes[1].submit_shared(p.now, 4, 2, b("B's, paired"));
    p.run();
    assert_eq!(
        p.seen[1].done.last(),
        Some(&(4, Ok(SharedOutcome::Stored(3))))
    );
    assert_eq!(p.state_of(0), b("B's, paired"));
}

#[test]
fn a_returning_node_drops_what_it_held_and_takes_the_survivors_state() {
    let mut p = Pair::paired();
    p.nodes[0].set_shared(5, b("agreed"));
    p.nodes[1].set_shared(5, b("agreed"));
    p.cut();
    p.now += 10 * 1000 * MS;
    for n in &mut p.nodes {
        n.tick(p.now);
    }
    p.run();
    p.nodes[1].race_result(p.now, RaceOutcome::Won { epoch: 2 });
    p.run();
    // Node 0 is still suspended (racing) and holds its change.
    p.nodes[0].submit_shared(p.now, 1, 5, b("A's, held"));
    p.run();
    assert!(p.seen[0].done.is_empty());
    p.nodes[1].submit_shared(p.now, 2, 5, b("B's, alone"));
    p.run();
    p.nodes[0].race_result(p.now, RaceOutcome::Lost { epoch: 2 });
    p.run();
    assert_eq!(p.seen[0].done, vec![(1, Err(HostError::Fenced))]);
    p.connect();
    assert_eq!((p.version(0), p.state_of(0)), (6, b("B's, alone")));
    assert_eq!((p.version(1), p.state_of(1)), (6, b("B's, alone")));
}

#[test]
fn an_unknown_acknowledgement_or_a_stray_snapshot_is_refused() {
    let mut p = Pair::paired();
    let refused_before = p.nodes[0].stats().refused;
    let m = |seq, body| Message {
        header: crate::wire::Header {
            epoch: p.nodes[1].epoch(),
            node: 1,
            seq,
        },
        body,
    };
    let ack = m(
        1_000,
        crate::wire::Body::SharedAck(crate::wire::SharedAck {
            id: 99,
            accepted: true,
        }),
    );
    // Out of sequence: refused and the link dropped, nothing installed.
    p.nodes[0].receive(p.now, ack);
    p.run();
    assert!(p.nodes[0].stats().refused > refused_before);
    assert!(p.seen[0].done.is_empty() && p.seen[0].installed.is_empty());
    // A paired node (not a sync target) refuses a snapshot.
    let mut q = Pair::paired();
    let snap = crate::wire::Body::Shared(crate::wire::Shared {
        id: 0,
        kind: crate::wire::SharedKind::Snapshot,
        base: 9,
        payload: b("forged"),
    });
    q.nodes[1].submit_notice(q.now, 1, b("x")); // so the data channel moves on at node 0
    q.run();
    // The next frame in sequence on the data channel, so only the content is at fault.
    let next = q.nodes[0].recv_seq[0] + 1;
    let before = q.nodes[0].stats().refused;
    q.nodes[0].receive(
        q.now,
        Message {
            header: crate::wire::Header {
                epoch: q.nodes[0].epoch(),
                node: 1,
                seq: next,
            },
            body: snap,
        },
    );
    q.run();
    assert_eq!(q.nodes[0].stats().refused, before + 1);
    assert_eq!(q.state_of(0), Bytes::new());
}
