//! Two replicas with in-memory disks wired back to back (every frame through the codec):
//! after a crash, resync copies the dirty regions and only those blocks of the crashed node's
//! activity-log extents that differ.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::action::Action;
use crate::config::Config;
use crate::epoch::RaceOutcome;
use crate::meta::Meta;
use crate::node::{Replica, State};
use crate::wire::{Body, Message};
use crate::{decode, encode_to_vec};

const MS: u64 = 1_000_000;
const LUN: u64 = 4096;
const BS: usize = 4096;

struct Pair {
    nodes: [Replica; 2],
    metas: [Meta; 2],
    disks: [Vec<u8>; 2],
    wire: [VecDeque<Message>; 2],
    connected: bool,
    now: u64,
    next_id: u64,
    /// Frame names sent, per node.
    sent: [Vec<&'static str>; 2],
    /// Resync messages vanish (heartbeats still pass): a resync that cannot move.
    lose_resync: bool,
    /// Events reported, per node.
    events: [Vec<crate::action::Event>; 2],
}

fn config(node: u8) -> Config {
    Config::new(node, 0, LUN)
}

impl Pair {
    fn paired() -> Pair {
        let metas = [0, 1].map(|n: u8| Meta::new(config(n).regions(), config(n).al_slots, 1));
        let mut p = Pair {
            nodes: [0, 1]
                .map(|n: u8| Replica::new(config(n), metas[n as usize].clone(), 0).unwrap()),
            metas,
            disks: [vec![0; LUN as usize * BS], vec![0; LUN as usize * BS]],
            wire: Default::default(),
            connected: false,
            now: 0,
            next_id: 1,
            sent: Default::default(),
            lose_resync: false,
            events: Default::default(),
        };
        p.connect();
        assert!(matches!(p.nodes[0].state(), State::Paired { .. }));
        assert!(matches!(p.nodes[1].state(), State::Paired { .. }));
        p
    }

    fn connect(&mut self) {
        self.connected = true;
        for n in &mut self.nodes {
            n.peer_connected(self.now);
        }
        self.run();
    }

    /// The nodes in `down` die at once, unaware (nothing more of theirs is journaled or sent),
    /// and start again from their journal and disk (no volatile cache here); a survivor sees
    /// the connection go.
    fn crash(&mut self, down: &[usize]) {
        self.connected = false;
        self.wire = Default::default();
        for i in 0..2 {
            if !down.contains(&i) {
                self.nodes[i].peer_disconnected(self.now);
            }
        }
        for &i in down {
            self.restart(i);
        }
        self.run();
    }

    fn restart(&mut self, i: usize) {
        self.nodes[i] = Replica::new(config(i as u8), self.metas[i].clone(), self.now).unwrap();
        self.run();
    }

    fn write(&mut self, i: usize, lba: u64, fill: u8) {
        let id = self.next_id;
        self.next_id += 1;
        let data = Bytes::from(vec![fill; BS]);
        self.nodes[i].submit_write(self.now, id, lba, 1, false, data);
        self.run();
    }

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
            Action::Send { message, .. }
                if self.lose_resync
                    && matches!(
                        message.body,
                        Body::ResyncData(_) | Body::ResyncAck(_) | Body::ResyncSums(_)
                    ) => {}
            Action::Send { message, .. } if self.connected => {
                self.sent[i].push(message.body.name());
                let frame = Bytes::from(encode_to_vec(&message));
                let (back, used) = decode(&frame).unwrap().unwrap();
                assert_eq!(used, frame.len());
                self.wire[1 - i].push_back(back);
            }
            Action::Persist { token, op } => {
                self.metas[i].apply(&op);
                n.meta_persisted(now, token);
            }
            Action::Fsync { token } => n.fsync_done(now, token),
            Action::Apply {
                token,
                lba,
                blocks,
                data,
                ..
            } => {
                let at = lba as usize * BS;
                self.disks[i][at..at + blocks as usize * BS].copy_from_slice(&data);
                n.apply_done(now, token);
            }
            Action::ReadForResync {
                token,
                lba,
                blocks,
                sums,
            } => {
                let at = lba as usize * BS;
                let data = &self.disks[i][at..at + blocks as usize * BS];
                let data = if sums {
                    Bytes::from(super::block_sums(data, BS as u32))
                } else {
                    Bytes::copy_from_slice(data)
                };
                n.resync_read_done(now, token, data);
            }
            Action::MarkInSync { .. } => n.in_sync_result(now, true),
            Action::Event(e) => self.events[i].push(e),
            _ => {}
        }
    }

    /// Node `winner` wins the race after a cut; the other is down.
    fn win_alone(&mut self, winner: usize) {
        self.now += 10 * 1000 * MS;
        self.nodes[winner].tick(self.now);
        self.run();
        self.nodes[winner].race_result(self.now, RaceOutcome::Won { epoch: 2 });
        self.run();
        assert!(matches!(self.nodes[winner].state(), State::Alone { .. }));
    }

    fn block(&self, i: usize, lba: u64) -> &[u8] {
        &self.disks[i][lba as usize * BS..(lba as usize + 1) * BS]
    }
}

/// Node 1 writes (replicated) into one activity-log extent, crashes, node 0 writes 101
/// blocks alone (50 of them inside that extent); node 1's `unreplicated` blocks were applied
/// on node 1 only, just before the crash.
fn crash_and_return(unreplicated: &[u64]) -> Pair {
    let mut p = Pair::paired();
    for lba in 100..110 {
        p.write(1, lba, 1);
    }
    assert_eq!(p.block(0, 105), p.block(1, 105));
    // Writes node 1 applies while its frames no longer reach node 0.
    p.connected = false;
    for &lba in unreplicated {
        p.write(1, lba, 9);
    }
    p.crash(&[1]);
    assert_eq!(p.nodes[1].suspect_regions(), 1024);
    p.win_alone(0);
    for lba in 3000..3051 {
        p.write(0, lba, 2);
    }
    for lba in 200..250 {
        p.write(0, lba, 3);
    }
    p.connect();
    assert!(matches!(p.nodes[0].state(), State::Paired { .. }));
    assert!(matches!(p.nodes[1].state(), State::Paired { .. }));
    assert!(p.disks[0] == p.disks[1], "replicas differ after resync");
    assert_eq!(p.nodes[1].dirty_regions(), 0);
    assert_eq!(p.nodes[0].dirty_regions(), 0);
    assert_eq!(p.nodes[0].suspect_regions(), 0);
    p
}

#[test]
fn a_crash_moves_what_was_written_alone_and_compares_the_activity_log() {
    let p = crash_and_return(&[]);
    let s = p.nodes[0].stats();
    // 101 dirty blocks copied; the rest of the extent (1024 - 50 written alone) compared,
    // and all of it matched.
    assert_eq!(s.resync_blocks, 101);
    assert_eq!(s.resync_compared_blocks, 974);
    assert_eq!(s.full_resyncs, 0);
    assert!(p.sent[0].contains(&"ResyncSums"));
    assert!(p.sent[1].contains(&"ResyncDiffer"));
}

#[test]
fn a_write_only_the_crashed_node_applied_is_copied_back() {
    let p = crash_and_return(&[500, 501, 230]);
    let s = p.nodes[0].stats();
    // 500 and 501 differ (copied back from node 0); 230 was also written alone by node 0.
    assert_eq!(s.resync_blocks, 103);
    assert_eq!(s.resync_compared_blocks, 974);
    assert_eq!(p.block(1, 500), &[0u8; BS][..]);
    assert_eq!(p.block(1, 230), &[3u8; BS][..]);
}

/// Both nodes stop and start from disk: the preferred node (0) is the source, and the
/// suspect extents of both are compared, each node's own unreplicated writes found either
/// way.
#[test]
fn both_crashed_the_suspect_extents_of_either_side_are_compared() {
    let mut p = Pair::paired();
    p.write(0, 10, 1);
    p.write(1, 2100, 1);
    p.connected = false;
    p.write(0, 20, 7);
    p.write(1, 2110, 8);
    p.crash(&[0, 1]);
    // Peer writes take activity-log extents too: extents 0 and 2 on both.
    assert_eq!(p.nodes[0].suspect_regions(), 2048);
    assert_eq!(p.nodes[1].suspect_regions(), 2048);
    p.connect();
    assert!(matches!(p.nodes[0].state(), State::Paired { .. }));
    assert!(matches!(p.nodes[1].state(), State::Paired { .. }));
    assert!(p.disks[0] == p.disks[1], "replicas differ after resync");
    let s = p.nodes[0].stats();
    assert_eq!((s.resync_blocks, s.resync_compared_blocks), (2, 2048));
    // The source's own unreplicated write won; the target's was undone.
    assert_eq!(p.block(1, 20), &[7u8; BS][..]);
    assert_eq!(p.block(1, 2110), &[0u8; BS][..]);
}

/// A write of the source lands on a suspect block while its checksum is in flight: the target
/// ends with the write, not with older data, and the pair only finishes once it matches.
#[test]
fn a_write_racing_the_comparison_is_not_undone() {
    let mut p = Pair::paired();
    p.write(1, 100, 1);
    p.connected = false;
    p.write(1, 101, 9);
    p.crash(&[1]);
    p.win_alone(0);
    p.connected = true;
    for n in &mut p.nodes {
        n.peer_connected(p.now);
    }
    // Deliver frames one at a time until the first checksums are on their way to node 1,
    // then write over the differing block on node 0 before node 1 compares.
    let mut raced = false;
    for _ in 0..100_000 {
        for i in 0..2 {
            while let Some(a) = p.nodes[i].poll_action() {
                p.action(i, a);
            }
        }
        if !raced
            && p.wire[1]
                .iter()
                .any(|m| matches!(m.body, Body::ResyncSums(_)))
        {
            raced = true;
            let id = 99;
            p.nodes[0].submit_write(p.now, id, 101, 1, false, Bytes::from(vec![5u8; BS]));
            p.nodes[0].submit_write(p.now, id + 1, 102, 1, false, Bytes::from(vec![6u8; BS]));
            continue;
        }
        let mut moved = false;
        for i in 0..2 {
            if let Some(m) = p.wire[i].pop_front() {
                moved = true;
                p.nodes[i].receive(p.now, m);
            }
        }
        if !moved && (0..2).all(|i| p.wire[i].is_empty()) {
            break;
        }
    }
    p.run();
    assert!(raced);
    assert!(matches!(p.nodes[1].state(), State::Paired { .. }));
    assert_eq!(p.block(0, 101), &[5u8; BS][..]);
    assert_eq!(p.block(1, 101), &[5u8; BS][..]);
    assert_eq!(p.block(1, 102), &[6u8; BS][..]);
    assert!(p.disks[0] == p.disks[1], "replicas differ after resync");
}

/// Node 1 crashed, node 0 won the race and wrote 10 blocks alone: a resync of 10 blocks awaits
/// node 1's return.
fn alone_with_ten_writes() -> Pair {
    let mut p = Pair::paired();
    p.crash(&[1]);
    p.win_alone(0);
    for lba in 3000..3010 {
        p.write(0, lba, 2);
    }
    p
}

/// The sync source finds every operation slot taken (here by applies of an old connection
/// still under way) when the resync starts: the regions wait, they are not forgotten, and the
/// resync finishes once the slots free.
#[test]
fn a_resync_that_finds_no_free_slot_waits_for_one() {
    use crate::node::ops::{Kind, Op, Phase};
    let mut p = alone_with_ten_writes();
    let mut held = Vec::new();
    let n0 = &mut p.nodes[0];
    while let Some(slot) = {
        let mut op = Op::new(Kind::Peer { wseq: 0 }, 4000, 1, false, Bytes::new(), 0);
        op.phase = Phase::Running;
        n0.ops.insert(op)
    } {
        held.push(n0.ops.token(slot));
    }
    p.connect();
    assert!(matches!(p.nodes[0].state(), State::ResyncSource { .. }));
    assert!(p.nodes[0].stats().resync_deferred > 0);
    for token in held {
        let now = p.now;
        p.nodes[0].apply_done(now, token);
        p.run();
    }
    assert!(matches!(p.nodes[0].state(), State::Paired { .. }));
    assert!(matches!(p.nodes[1].state(), State::Paired { .. }));
    assert_eq!(p.nodes[0].stats().resync_blocks, 10);
    assert!(p.disks[0] == p.disks[1], "replicas differ after resync");
}

/// A resync whose messages stop getting through while heartbeats still do: after the stall
/// timeout the source reports it, with what it waited for, and closes the connection; the
/// next handshake finishes the job.
#[test]
fn a_resync_that_moves_nothing_is_started_again() {
    use crate::action::Event;
    let mut p = alone_with_ten_writes();
    p.lose_resync = true;
    let started = p.now;
    p.connect();
    assert!(matches!(p.nodes[0].state(), State::ResyncSource { .. }));
    let stall = p.nodes[0].config().resync_stall;
    let until = p.now + stall + 200 * MS;
    let mut dropped_at = None;
    while p.now < until {
        p.now += 50 * MS;
        for i in 0..2 {
            let now = p.now;
            p.nodes[i].tick(now);
        }
        p.run();
        if dropped_at.is_none() && p.nodes[0].stats().resync_stalls > 0 {
            dropped_at = Some(p.now);
        }
    }
    let at = dropped_at.expect("the stalled resync was never noticed");
    assert!(
        at - started > stall && at - started <= stall + 100 * MS,
        "noticed after {} ms",
        (at - started) / MS
    );
    let report = p.events[0].iter().find_map(|e| match e {
        Event::ResyncStalled { inflight } => Some(inflight.clone()),
        _ => None,
    });
    let report = report.expect("no ResyncStalled event");
    assert!(report.contains("to copy"), "report: {report}");
    assert!(!matches!(p.nodes[0].state(), State::ResyncSource { .. }));
    // The target hears no more and lets go too; the next connection finishes the resync.
    p.connected = false;
    p.nodes[1].peer_disconnected(p.now);
    p.lose_resync = false;
    p.connect();
    assert!(matches!(p.nodes[0].state(), State::Paired { .. }));
    assert!(matches!(p.nodes[1].state(), State::Paired { .. }));
    assert!(p.disks[0] == p.disks[1], "replicas differ after resync");
    assert_eq!(p.nodes[0].stats().resync_stalls, 1);
}
