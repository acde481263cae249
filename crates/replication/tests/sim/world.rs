//! The simulated world and its event loop.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use replication::epoch::{in_sync_proposal, race_proposal};
use replication::{
    decode, encode_to_vec, AbortScope, Action, CawOutcome, Channel, Config, EpochRecord, Meta,
    RaceOutcome, Replica, State, Token,
};

use super::caw::{CawLog, CawStats, End};
use super::disk::{Disk, MetaStore};
use super::oracle::{block_bytes, Oracle, BLOCK};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

/// Which faults a run may see.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub crash: bool,
    pub power_loss: bool,
    pub pause: bool,
    pub partition: bool,
    pub etcd_partition: bool,
    pub net_chaos: bool,
}

impl Faults {
    pub fn all() -> Faults {
        Faults {
            crash: true,
            power_loss: true,
            pause: true,
            partition: true,
            etcd_partition: true,
            net_chaos: true,
        }
    }
    pub fn none() -> Faults {
        Faults {
            crash: false,
            power_loss: false,
            pause: false,
            partition: false,
            etcd_partition: false,
            net_chaos: false,
        }
    }
}

/// Deliberate breakage, to show the oracle catches it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Knobs {
    /// The driver of node 1 reports applies done without writing them.
    pub lose_applies_on_1: bool,
    /// The driver of node 1 tells the core it won every race without asking the store.
    pub fake_race_wins_on_1: bool,
    /// Corrupt a block of node 1 after the run.
    pub corrupt_at_end: bool,
    /// COMPARE AND WRITEs: random ones among the host's requests (blocks 1..), and rounds on
    /// block 0 (both nodes at once, same expected version, different new data; plain writes
    /// stay off block 0).
    pub caws: bool,
    /// LUN size (default: random, small, so that writes overlap).
    pub lun_blocks: Option<u64>,
    /// One scripted fault instead of random ones.
    pub script: Option<Script>,
}

/// A scripted fault (times in milliseconds).
#[derive(Debug, Clone, Copy)]
pub enum Script {
    /// Cut the peer link at `at` for `dur`.
    Partition { at: u64, dur: u64 },
    /// Power loss of `node` at `at`; it starts again `down` later.
    PowerLoss { node: usize, at: u64, down: u64 },
}

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    pub violations: Vec<String>,
    pub acked: u64,
    pub reads: u64,
    pub events: u64,
    pub resync_blocks: u64,
    /// Suspect blocks compared by checksum (not counted in `resync_blocks`).
    pub resync_compared_blocks: u64,
    pub superseded: u64,
    pub retried: u64,
    /// Blocks acknowledged by a node writing alone.
    pub alone_written: u64,
    pub full_resyncs: u64,
    pub caw: CawStats,
    pub odd_rounds: Vec<String>,
}

/// What a local read is for, and so what the node is handed back.
#[derive(Debug, Clone, Copy)]
enum ReadFor {
    Caw,
    Resync,
    /// A resync read with `sums`: the blocks' checksums, as the driver hashes them.
    ResyncSums,
}

#[derive(Debug)]
enum Ev {
    Tick(usize),
    Apply {
        n: usize,
        inc: u64,
        token: Token,
        lba: u64,
        data: Bytes,
        fua: bool,
    },
    Read {
        n: usize,
        inc: u64,
        token: Token,
        lba: u64,
        blocks: u32,
        for_: ReadFor,
    },
    Fsync {
        n: usize,
        inc: u64,
        token: Token,
    },
    Persist {
        n: usize,
        inc: u64,
        token: Token,
    },
    Deliver {
        to: usize,
        conn: u64,
        frame: Bytes,
    },
    Disconnect {
        n: usize,
        conn: u64,
    },
    Reconnect,
    Race {
        n: usize,
        inc: u64,
    },
    RaceDone {
        n: usize,
        inc: u64,
        outcome: RaceOutcome,
    },
    InSync {
        n: usize,
        inc: u64,
        epoch: u64,
    },
    InSyncDone {
        n: usize,
        inc: u64,
        ok: bool,
    },
    Host,
    Fault,
    Restart(usize),
    Heal,
    Script(Script),
    /// Start the next CAW round.
    Round,
}

struct Node {
    replica: Option<Replica>,
    inc: u64,
    disk: Disk,
    meta: MetaStore,
    conn: Option<u64>,
    paused_until: u64,
    etcd_cut_until: u64,
    /// Last completion time of each kind of local I/O queue (journal in order).
    journal_at: u64,
    /// Host writes in flight here: uid.
    inflight: Vec<u64>,
    /// Applies issued and not completed (for crash effects): token -> (lba, data).
    applying: BTreeMap<Token, (u64, Bytes)>,
}

pub struct World {
    now: u64,
    rng: StdRng,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: BTreeMap<u64, Ev>,
    seq: u64,
    nodes: [Node; 2],
    cfgs: [Config; 2],
    etcd: EpochRecord,
    // Peer link.
    conn: u64,
    link_up: bool,
    partitioned_until: u64,
    fifo: [[u64; 2]; 2],
    reconnect_pending: bool,
    // Host.
    next_uid: u64,
    next_flush: u64,
    flush_submit: BTreeMap<u64, u64>,
    aborts: BTreeMap<u64, AbortScope>,
    pub oracle: Oracle,
    faults: Faults,
    knobs: Knobs,
    load_until: u64,
    end_at: u64,
    events_run: u64,
    trace: bool,
    alone_written: u64,
    pub caws: CawLog,
    /// The round under way, and block 0's content after the last clean round.
    round: Option<u64>,
    round_value: Option<[u8; BLOCK]>,
}

fn config(node: u8, blocks: u64) -> Config {
    let mut c = Config::new(node, 0, blocks);
    c.block_size = BLOCK as u32;
    c.region_blocks = 1;
    c.al_extent_blocks = 4;
    c.al_slots = 6;
    c.max_inflight = 8;
    c.heartbeat_interval = 100 * MS;
    c.read_lease = 200 * MS;
    c.tie_delay = 100 * MS;
    c.race_retry = 100 * MS;
    c.resync_chunk_regions = 4;
    c.resync_window = 3;
    c
}

impl World {
    pub fn new(seed: u64, faults: Faults, knobs: Knobs) -> World {
        let mut rng = StdRng::seed_from_u64(seed);
        let blocks = knobs.lun_blocks.unwrap_or_else(|| rng.gen_range(24..64));
        let cfgs = [config(0, blocks), config(1, blocks)];
        let meta = Meta::new(cfgs[0].regions(), cfgs[0].al_slots, 1);
        let node = |meta: &Meta| Node {
            replica: None,
            inc: 0,
            disk: Disk::new(blocks),
            meta: MetaStore::new(meta.clone()),
            conn: None,
            paused_until: 0,
            etcd_cut_until: 0,
            journal_at: 0,
            inflight: Vec::new(),
            applying: BTreeMap::new(),
        };
        let load_until = if knobs.script.is_some() {
            3000 * MS
        } else {
            rng.gen_range(1500..4000) * MS
        };
        let mut w = World {
            now: 0,
            rng,
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            seq: 0,
            nodes: [node(&meta), node(&meta)],
            cfgs,
            etcd: EpochRecord::default(),
            conn: 0,
            link_up: false,
            partitioned_until: 0,
            fifo: [[0; 2]; 2],
            reconnect_pending: false,
            next_uid: 1,
            next_flush: 1,
            flush_submit: BTreeMap::new(),
            aborts: BTreeMap::new(),
            oracle: Oracle::new(blocks),
            faults,
            knobs,
            load_until,
            end_at: load_until + 60_000 * MS,
            events_run: 0,
            trace: std::env::var("REPL_TRACE").is_ok(),
            alone_written: 0,
            caws: CawLog::default(),
            round: None,
            round_value: Some([0; BLOCK]),
        };
        for n in 0..2 {
            w.start(n);
            w.at(0, Ev::Tick(n));
        }
        w.at(MS, Ev::Reconnect);
        w.reconnect_pending = true;
        w.at(5 * MS, Ev::Host);
        if knobs.caws {
            w.at(20 * MS, Ev::Round);
        }
        match knobs.script {
            Some(s) => {
                let at = match s {
                    Script::Partition { at, .. } | Script::PowerLoss { at, .. } => at,
                };
                w.at(at * MS, Ev::Script(s));
            }
            None => {
                let first_fault = w.rng.gen_range(100..800) * MS;
                w.at(first_fault, Ev::Fault);
            }
        }
        w.at(load_until, Ev::Heal);
        w
    }

    fn at(&mut self, delay: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((self.now + delay, self.seq)));
        self.events.insert(self.seq, ev);
    }

    fn start(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        node.inc += 1;
        node.journal_at = self.now;
        if self.trace {
            let m = &node.meta.durable;
            println!(
                "{:>10.3} n{n} START al {:?} dirty words {:?} gens {:?} outdated {}",
                self.now as f64 / 1e6,
                m.al,
                m.bitmap,
                m.gens,
                m.outdated
            );
        }
        let r = Replica::new(self.cfgs[n].clone(), node.meta.durable.clone(), self.now)
            .expect("valid config");
        node.replica = Some(r);
        self.drain(n);
    }

    fn alive(&self, n: usize) -> bool {
        self.nodes[n].replica.is_some()
    }

    /// Run to the end; the outcome lists any invariant broken.
    pub fn run(mut self) -> Outcome {
        while let Some(Reverse((t, s))) = self.queue.pop() {
            let Some(ev) = self.events.remove(&s) else {
                continue;
            };
            self.now = t;
            self.events_run += 1;
            if let Some(n) = target(&ev) {
                if self.nodes[n].paused_until > t {
                    let d = self.nodes[n].paused_until - t;
                    self.at(d, ev);
                    continue;
                }
            }
            self.handle(ev);
            if self.now >= self.load_until && self.converged() {
                break;
            }
            if self.now > self.end_at {
                let states: Vec<String> = (0..2)
                    .map(|n| {
                        let node = &self.nodes[n];
                        let dirty = node.replica.as_ref().map(|r| r.dirty_regions());
                        let ops = node.replica.as_ref().map(|r| r.describe_inflight());
                        format!(
                            "{} dirty {:?} inflight {:?} applying {} conn {:?} ops {:?}",
                            self.state_name(n),
                            dirty,
                            node.inflight,
                            node.applying.len(),
                            node.conn,
                            ops
                        )
                    })
                    .collect();
                self.oracle.violation(format!(
                    "no convergence by {} ms: {:?}",
                    self.now / MS,
                    states
                ));
                break;
            }
        }
        self.final_check();
        let stats: Vec<_> = self
            .nodes
            .iter()
            .filter_map(|n| n.replica.as_ref().map(|r| r.stats()))
            .collect();
        Outcome {
            violations: std::mem::take(&mut self.oracle.violations),
            acked: self.oracle.acked,
            reads: self.oracle.reads_checked,
            events: self.events_run,
            resync_blocks: stats.iter().map(|s| s.resync_blocks).sum(),
            resync_compared_blocks: stats.iter().map(|s| s.resync_compared_blocks).sum(),
            superseded: stats.iter().map(|s| s.superseded).sum(),
            retried: stats.iter().map(|s| s.retried).sum(),
            alone_written: self.alone_written,
            full_resyncs: stats.iter().map(|s| s.full_resyncs).sum(),
            caw: self.caws.stats(),
            odd_rounds: self.caws.odd_rounds(),
        }
    }

    fn state_name(&self, n: usize) -> String {
        self.nodes[n].replica.as_ref().map_or("down".into(), |r| {
            format!("{:?}", r.state()).chars().take(60).collect()
        })
    }

    fn converged(&self) -> bool {
        (0..2).all(|n| {
            let node = &self.nodes[n];
            node.replica.as_ref().is_some_and(|r| {
                matches!(r.state(), State::Paired { .. }) && r.dirty_regions() == 0
            }) && node.inflight.is_empty()
                && node.applying.is_empty()
        })
    }

    fn final_check(&mut self) {
        let blocks = self.cfgs[0].lun_blocks;
        if self.knobs.corrupt_at_end {
            let b = self.rng.gen_range(0..blocks);
            let other = self.nodes[0].disk.read(b);
            let mut bad = other;
            bad[0] ^= 1;
            self.nodes[1].disk.corrupt(b, bad);
        }
        let t = self.now + 1;
        for b in 0..blocks {
            let (x, y) = (self.nodes[0].disk.read(b), self.nodes[1].disk.read(b));
            if x != y {
                self.oracle
                    .violation(format!("replicas differ at block {b}"));
            }
            self.oracle.check_block(b, &x, t, "final");
        }
        let last: Vec<u64> = (0..blocks)
            .map(|b| super::oracle::parse_block(&self.nodes[0].disk.read(b)).map_or(0, |v| v.0))
            .collect();
        self.caws.check(&mut self.oracle, &last, t);
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Tick(n) => {
                if let Some(r) = self.nodes[n].replica.as_mut() {
                    r.tick(self.now);
                    self.drain(n);
                }
                self.at(10 * MS, Ev::Tick(n));
            }
            Ev::Apply {
                n,
                inc,
                token,
                lba,
                data,
                fua,
            } => {
                if self.nodes[n].inc != inc || !self.alive(n) {
                    return;
                }
                self.nodes[n].applying.remove(&token);
                if !(self.knobs.lose_applies_on_1 && n == 1 && self.rng.gen_bool(0.2)) {
                    self.nodes[n].disk.write(lba, &data, fua);
                }
                self.call(n, |r, now| r.apply_done(now, token));
            }
            Ev::Read {
                n,
                inc,
                token,
                lba,
                blocks,
                for_,
            } => {
                if self.nodes[n].inc != inc || !self.alive(n) {
                    return;
                }
                let mut v = Vec::with_capacity(blocks as usize * BLOCK);
                for b in lba..lba + u64::from(blocks) {
                    v.extend_from_slice(&self.nodes[n].disk.read(b));
                }
                match for_ {
                    ReadFor::Caw => {
                        self.call(n, |r, now| r.caw_read_done(now, token, Bytes::from(v)))
                    }
                    ReadFor::Resync => {
                        self.call(n, |r, now| r.resync_read_done(now, token, Bytes::from(v)))
                    }
                    ReadFor::ResyncSums => {
                        let sums = replication::node::block_sums(&v, BLOCK as u32);
                        self.call(n, |r, now| {
                            r.resync_read_done(now, token, Bytes::from(sums))
                        })
                    }
                }
            }
            Ev::Fsync { n, inc, token } => {
                if self.nodes[n].inc != inc || !self.alive(n) {
                    return;
                }
                self.nodes[n].disk.fsync();
                self.call(n, |r, now| r.fsync_done(now, token));
            }
            Ev::Persist { n, inc, token } => {
                if self.nodes[n].inc != inc || !self.alive(n) {
                    return;
                }
                self.nodes[n].meta.complete(token);
                self.call(n, |r, now| r.meta_persisted(now, token));
            }
            Ev::Deliver { to, conn, frame } => self.deliver(to, conn, frame),
            Ev::Disconnect { n, conn } => {
                if self.nodes[n].conn == Some(conn) {
                    self.nodes[n].conn = None;
                    self.call(n, |r, now| r.peer_disconnected(now));
                }
            }
            Ev::Reconnect => self.reconnect(),
            Ev::Race { n, inc } => self.race(n, inc),
            Ev::RaceDone { n, inc, outcome } => {
                if self.nodes[n].inc == inc {
                    self.call(n, |r, now| r.race_result(now, outcome));
                }
            }
            Ev::InSync { n, inc, epoch } => {
                let reachable = self.nodes[n].etcd_cut_until <= self.now;
                let ok = reachable && {
                    if let Some(p) = in_sync_proposal(&self.etcd, n as u8, epoch) {
                        self.etcd = p;
                    }
                    true
                };
                let d = self.rng.gen_range(1..5) * MS;
                self.at(d, Ev::InSyncDone { n, inc, ok });
            }
            Ev::InSyncDone { n, inc, ok } => {
                if self.nodes[n].inc == inc {
                    self.call(n, |r, now| r.in_sync_result(now, ok));
                }
            }
            Ev::Host => self.host_op(),
            Ev::Round => self.start_round(),
            Ev::Script(Script::Partition { dur, .. }) => {
                self.partitioned_until = self.now + dur * MS;
                self.cut_with(false);
                self.at(dur * MS + MS, Ev::Reconnect);
            }
            Ev::Script(Script::PowerLoss { node, down, .. }) => {
                self.crash(node, true);
                self.at(down * MS, Ev::Restart(node));
            }
            Ev::Fault => self.fault(),
            Ev::Restart(n) => {
                if !self.alive(n) {
                    self.start(n);
                    self.schedule_reconnect();
                }
            }
            Ev::Heal => {
                for n in 0..2 {
                    self.nodes[n].etcd_cut_until = 0;
                    if !self.alive(n) {
                        self.at(MS, Ev::Restart(n));
                    }
                }
                self.partitioned_until = 0;
                self.schedule_reconnect();
            }
        }
    }

    fn call(&mut self, n: usize, f: impl FnOnce(&mut Replica, u64)) {
        let now = self.now;
        if let Some(r) = self.nodes[n].replica.as_mut() {
            f(r, now);
            self.drain(n);
        }
    }

    fn drain(&mut self, n: usize) {
        loop {
            let Some(a) = self.nodes[n].replica.as_mut().and_then(|r| r.poll_action()) else {
                break;
            };
            self.action(n, a);
        }
    }

    fn action(&mut self, n: usize, a: Action) {
        let inc = self.nodes[n].inc;
        if self.trace {
            match &a {
                Action::Send { message, .. }
                    if !matches!(
                        message.body,
                        replication::Body::Heartbeat(_) | replication::Body::HeartbeatAck(_)
                    ) =>
                {
                    println!(
                        "{:>10.3} n{n} send {:?}",
                        self.now as f64 / 1e6,
                        message.body_summary()
                    )
                }
                Action::Send { .. }
                | Action::Persist { .. }
                | Action::Fsync { .. }
                | Action::ReadForResync { .. }
                | Action::ReadForCaw { .. } => {}
                other => println!("{:>10.3} n{n} {:?}", self.now as f64 / 1e6, other),
            }
        }
        match a {
            Action::Send { channel, message } => {
                let Some(conn) = self.nodes[n].conn else {
                    return;
                };
                if !self.link_up || conn != self.conn {
                    return;
                }
                let frame = Bytes::from(encode_to_vec(&message));
                self.send_frame(n, channel, conn, frame);
            }
            Action::DropPeerConnection => {
                if self.nodes[n].conn == Some(self.conn) {
                    self.nodes[n].conn = None;
                }
                self.cut();
            }
            Action::Apply {
                token,
                lba,
                blocks: _,
                fua,
                data,
            } => {
                self.nodes[n].applying.insert(token, (lba, data.clone()));
                let d = self.rng.gen_range(20..3000) * US;
                self.at(
                    d,
                    Ev::Apply {
                        n,
                        inc,
                        token,
                        lba,
                        data,
                        fua,
                    },
                );
            }
            Action::ReadForResync {
                token,
                lba,
                blocks,
                sums,
            } => {
                let d = self.rng.gen_range(20..2000) * US;
                let for_ = if sums {
                    ReadFor::ResyncSums
                } else {
                    ReadFor::Resync
                };
                self.at(
                    d,
                    Ev::Read {
                        n,
                        inc,
                        token,
                        lba,
                        blocks,
                        for_,
                    },
                );
            }
            Action::ReadForCaw { token, lba, blocks } => {
                let d = self.rng.gen_range(20..2000) * US;
                self.at(
                    d,
                    Ev::Read {
                        n,
                        inc,
                        token,
                        lba,
                        blocks,
                        for_: ReadFor::Caw,
                    },
                );
            }
            Action::CawDone { id, result } => {
                self.nodes[n].inflight.retain(|&u| u != id);
                let end = match result {
                    Ok(CawOutcome::Written) => End::Written,
                    Ok(CawOutcome::Miscompare(i)) => End::Miscompare(i),
                    Err(_) => End::Failed,
                };
                if end == End::Written {
                    if let Some(State::Alone { epoch }) =
                        self.nodes[n].replica.as_ref().map(|r| r.state().clone())
                    {
                        self.oracle.alone_ack(epoch, n);
                    }
                }
                self.caws.done(id, end, self.now, &mut self.oracle);
                self.round_step();
            }
            Action::Fsync { token } => {
                let d = self.rng.gen_range(100..4000) * US;
                self.at(d, Ev::Fsync { n, inc, token });
            }
            Action::Persist { token, op } => {
                self.nodes[n].meta.append(token, op);
                let t = self.nodes[n].journal_at.max(self.now) + self.rng.gen_range(50..1500) * US;
                self.nodes[n].journal_at = t;
                let d = t - self.now;
                self.at(d, Ev::Persist { n, inc, token });
            }
            Action::AckWrite { id, result } => {
                self.nodes[n].inflight.retain(|&u| u != id);
                if result.is_ok() {
                    if let Some(State::Alone { epoch }) =
                        self.nodes[n].replica.as_ref().map(|r| r.state().clone())
                    {
                        self.oracle.alone_ack(epoch, n);
                        self.alone_written += self
                            .oracle
                            .writes
                            .get(&id)
                            .map_or(0, |w| u64::from(w.blocks));
                    }
                }
                self.oracle.answered(id, result.is_ok(), self.now);
            }
            Action::AckFlush { id, result } => {
                if let (Some(s), Ok(())) = (self.flush_submit.remove(&id), result) {
                    self.oracle.flushes.push((s, self.now));
                }
            }
            Action::AbortDone { id } => {
                // Every write the abort covers has its answer (acknowledged: applied on both;
                // failed: never acknowledged).
                let scope = self.aborts.remove(&id);
                let pending: Vec<u64> = match scope {
                    Some(AbortScope::Task(u)) => self.nodes[n]
                        .inflight
                        .iter()
                        .copied()
                        .filter(|&x| x == u)
                        .collect(),
                    Some(AbortScope::All) => self.nodes[n].inflight.clone(),
                    None => Vec::new(),
                };
                if let Some(u) = pending.first() {
                    let now = self.now;
                    self.oracle.violation(format!(
                        "abort {id} on node {n} done at {now} with write {u} unanswered"
                    ));
                }
            }
            Action::RaceForEpoch => {
                if self.knobs.fake_race_wins_on_1 && n == 1 {
                    let epoch = self.etcd.epoch + 1;
                    self.at(
                        MS,
                        Ev::RaceDone {
                            n,
                            inc,
                            outcome: RaceOutcome::Won { epoch },
                        },
                    );
                    return;
                }
                let d = self.rng.gen_range(1..10) * MS;
                self.at(d, Ev::Race { n, inc });
            }
            Action::MarkInSync { epoch } => {
                let d = self.rng.gen_range(1..5) * MS;
                self.at(d, Ev::InSync { n, inc, epoch });
            }
            Action::SetAlua(_)
            | Action::ResyncProgress { .. }
            | Action::Event(_)
            | Action::SharedInstalled { .. }
            | Action::SharedNotice { .. }
            | Action::SharedDone { .. } => {}
        }
    }

    fn send_frame(&mut self, from: usize, channel: Channel, conn: u64, frame: Bytes) {
        let to = 1 - from;
        let c = usize::from(channel == Channel::Control);
        let chaos = self.faults.net_chaos;
        let mut delay = self.rng.gen_range(50..1500) * US;
        if chaos && self.rng.gen_bool(0.002) {
            delay += self.rng.gen_range(100..500) * MS; // a stall: may trip the failure detector
        }
        let mut t = (self.now + delay).max(self.fifo[from][c]);
        if chaos && self.rng.gen_bool(0.0005) {
            t = self.now + delay / 4; // overtakes earlier frames of its channel: a sequence gap
        } else {
            self.fifo[from][c] = t;
        }
        let mut frame = frame;
        if chaos && self.rng.gen_bool(0.0005) {
            let mut v = frame.to_vec();
            let i = self.rng.gen_range(0..v.len());
            v[i] ^= 1 << self.rng.gen_range(0..8);
            frame = Bytes::from(v);
        }
        let d = t - self.now;
        if chaos && self.rng.gen_bool(0.003) {
            let extra = self.rng.gen_range(0..50) * MS;
            self.at(
                d + extra,
                Ev::Deliver {
                    to,
                    conn,
                    frame: frame.clone(),
                },
            );
        }
        self.at(d, Ev::Deliver { to, conn, frame });
    }

    fn deliver(&mut self, to: usize, conn: u64, frame: Bytes) {
        if !self.link_up
            || conn != self.conn
            || self.nodes[to].conn != Some(conn)
            || self.partitioned_until > self.now
        {
            return;
        }
        match decode(&frame) {
            Ok(Some((msg, used))) if used == frame.len() => {
                self.call(to, |r, now| r.receive(now, msg))
            }
            _ => {
                // A corrupt frame: the driver closes the connection.
                self.nodes[to].conn = None;
                self.call(to, |r, now| r.peer_disconnected(now));
                self.cut();
            }
        }
    }

    /// The connection breaks; each side notices after a while (or by heartbeats).
    fn cut(&mut self) {
        self.cut_with(true);
    }

    fn cut_with(&mut self, notify: bool) {
        if !self.link_up {
            return;
        }
        self.link_up = false;
        let conn = self.conn;
        for n in 0..2 {
            if notify && self.nodes[n].conn == Some(conn) && self.rng.gen_bool(0.7) {
                let d = self.rng.gen_range(0..20) * MS;
                self.at(d, Ev::Disconnect { n, conn });
            }
        }
        self.schedule_reconnect();
    }

    fn schedule_reconnect(&mut self) {
        if !self.reconnect_pending {
            self.reconnect_pending = true;
            let d = self.rng.gen_range(20..300) * MS;
            self.at(d, Ev::Reconnect);
        }
    }

    fn reconnect(&mut self) {
        self.reconnect_pending = false;
        if self.link_up || !self.alive(0) || !self.alive(1) {
            return;
        }
        if self.partitioned_until > self.now || self.nodes.iter().any(|n| n.conn.is_some()) {
            // Wait for the partition to heal, or for both ends to notice the old connection died.
            self.schedule_reconnect();
            return;
        }
        self.conn += 1;
        self.link_up = true;
        self.fifo = [[self.now; 2]; 2];
        for n in 0..2 {
            self.nodes[n].conn = Some(self.conn);
        }
        for n in 0..2 {
            self.call(n, |r, now| r.peer_connected(now));
        }
    }

    fn race(&mut self, n: usize, inc: u64) {
        let reachable = self.nodes[n].etcd_cut_until <= self.now;
        let outcome = if !reachable {
            RaceOutcome::Unreachable
        } else {
            match race_proposal(&self.etcd, n as u8) {
                Some(p) => {
                    self.etcd = p;
                    RaceOutcome::Won { epoch: p.epoch }
                }
                None => RaceOutcome::Lost {
                    epoch: self.etcd.epoch,
                },
            }
        };
        // The answer may be lost on the way back.
        let lost_reply = self.faults.etcd_partition && self.rng.gen_bool(0.05);
        let outcome = if lost_reply {
            RaceOutcome::Unreachable
        } else {
            outcome
        };
        let d = self.rng.gen_range(1..10) * MS;
        self.at(d, Ev::RaceDone { n, inc, outcome });
    }

    fn host_op(&mut self) {
        if self.now >= self.load_until {
            return;
        }
        let next = self.rng.gen_range(100..2500) * US;
        self.at(next, Ev::Host);
        let n = self.rng.gen_range(0..2);
        if !self.alive(n) || self.nodes[n].paused_until > self.now {
            return;
        }
        let blocks = self.cfgs[0].lun_blocks;
        let roll = self.rng.gen_range(0..100);
        if self.knobs.caws && roll < 12 {
            self.random_caw(n);
        } else if roll < 65 {
            let len = self.rng.gen_range(1..=4u32);
            let first = u64::from(self.knobs.caws);
            let lba = self.rng.gen_range(first..=blocks - u64::from(len));
            let fua = self.rng.gen_bool(0.1);
            let uid = self.next_uid;
            self.next_uid += 1;
            let mut data = Vec::with_capacity(len as usize * BLOCK);
            for i in 0..len {
                data.extend_from_slice(&block_bytes(uid, i));
            }
            self.oracle.submit(uid, n, lba, len, fua, self.now);
            self.nodes[n].inflight.push(uid);
            let data = Bytes::from(data);
            self.call(n, |r, now| r.submit_write(now, uid, lba, len, fua, data));
        } else if roll < 93 {
            let len = self.rng.gen_range(1..=8u64).min(blocks);
            let lba = self.rng.gen_range(0..=blocks - len);
            let now = self.now;
            let allowed = self.nodes[n]
                .replica
                .as_ref()
                .is_some_and(|r| r.read_allowed(now));
            if allowed {
                for b in lba..lba + len {
                    let data = self.nodes[n].disk.read(b);
                    self.oracle.reads_checked += 1;
                    self.oracle
                        .check_block(b, &data, now, &format!("read on node {n}"));
                }
            }
        } else if roll < 98 {
            let id = self.next_flush;
            self.next_flush += 1;
            self.flush_submit.insert(id, self.now);
            self.call(n, |r, now| r.submit_flush(now, id));
        } else {
            let scope = match self.nodes[n].inflight.first() {
                Some(&u) if self.rng.gen_bool(0.5) => AbortScope::Task(u),
                _ => AbortScope::All,
            };
            let id = self.next_flush;
            self.next_flush += 1;
            self.aborts.insert(id, scope);
            self.call(n, |r, now| r.abort(now, id, scope));
        }
    }

    fn fault(&mut self) {
        if self.now >= self.load_until {
            return;
        }
        let next = self.rng.gen_range(200..1500) * MS;
        self.at(next, Ev::Fault);
        let n = self.rng.gen_range(0..2);
        let f = self.faults;
        match self.rng.gen_range(0..6) {
            0 if f.crash || f.power_loss => {
                if !self.alive(n) {
                    return;
                }
                let power = f.power_loss && (!f.crash || self.rng.gen_bool(0.5));
                self.crash(n, power);
                let d = self.rng.gen_range(100..1500) * MS;
                self.at(d, Ev::Restart(n));
            }
            1 if f.pause => {
                let d = self.rng.gen_range(50..900) * MS;
                self.nodes[n].paused_until = self.now + d;
            }
            2 | 3 if f.partition => {
                let d = self.rng.gen_range(50..1500) * MS;
                self.partitioned_until = self.now + d;
                if self.rng.gen_bool(0.5) {
                    self.cut();
                }
                let d2 = d + MS;
                self.at(d2, Ev::Reconnect);
            }
            4 | 5 if f.etcd_partition => {
                let d = self.rng.gen_range(50..2000) * MS;
                let both = self.rng.gen_bool(0.3);
                for m in 0..2 {
                    if both || m == n {
                        self.nodes[m].etcd_cut_until = self.now + d;
                    }
                }
            }
            _ => {}
        }
    }

    fn crash(&mut self, n: usize, power: bool) {
        if self.trace {
            println!(
                "{:>10.3} n{n} CRASH power loss {power}",
                self.now as f64 / 1e6
            );
        }
        let mut rng = StdRng::seed_from_u64(self.rng.gen());
        let node = &mut self.nodes[n];
        node.replica = None;
        node.conn = None;
        node.paused_until = 0;
        // Applies in flight land, partly, or not at all (block by block).
        let applying = std::mem::take(&mut node.applying);
        for (_, (lba, data)) in applying {
            for (i, chunk) in data.chunks_exact(BLOCK).enumerate() {
                if rng.gen_bool(0.5) {
                    node.disk.write(lba + i as u64, chunk, false);
                }
            }
        }
        if power {
            node.disk.power_loss(&mut rng);
            self.oracle.power_losses.push(self.now);
        }
        node.meta.crash();
        node.inflight.clear();
        // The connection is gone; the peer sees a reset, or nothing (and finds out by
        // heartbeats).
        let reset = self.rng.gen_bool(0.5);
        self.cut_with(reset);
    }
}

/// The node an event runs on (deferred while that node is paused).
fn target(ev: &Ev) -> Option<usize> {
    match *ev {
        Ev::Tick(n)
        | Ev::Apply { n, .. }
        | Ev::Read { n, .. }
        | Ev::Fsync { n, .. }
        | Ev::Persist { n, .. }
        | Ev::Disconnect { n, .. }
        | Ev::RaceDone { n, .. }
        | Ev::InSyncDone { n, .. } => Some(n),
        Ev::Deliver { to, .. } => Some(to),
        _ => None,
    }
}

impl World {
    /// A CAW of 1 or 2 blocks (past block 0) expecting what node `n`'s disk holds now, as a
    /// host that read before it would.
    fn random_caw(&mut self, n: usize) {
        let blocks = self.cfgs[0].lun_blocks;
        let len = self.rng.gen_range(1..=2u32);
        let lba = self.rng.gen_range(1..=blocks - u64::from(len));
        let now = self.now;
        if !self.nodes[n]
            .replica
            .as_ref()
            .is_some_and(|r| r.read_allowed(now))
        {
            return;
        }
        let verify: Vec<[u8; BLOCK]> = (lba..lba + u64::from(len))
            .map(|b| self.nodes[n].disk.read(b))
            .collect();
        self.submit_caw(n, lba, &verify, None);
    }

    fn submit_caw(&mut self, n: usize, lba: u64, verify: &[[u8; BLOCK]], round: Option<u64>) {
        let Some(expected) = super::caw::versions(verify.iter().copied()) else {
            return; // a torn block: the oracle reports it elsewhere
        };
        let len = verify.len() as u32;
        let uid = self.next_uid;
        self.next_uid += 1;
        let mut data = Vec::with_capacity(len as usize * BLOCK);
        for i in 0..len {
            data.extend_from_slice(&block_bytes(uid, i));
        }
        let fua = self.rng.gen_bool(0.1);
        self.oracle.submit(uid, n, lba, len, fua, self.now);
        self.caws.submit(uid, lba, expected, self.now, round);
        self.nodes[n].inflight.push(uid);
        let verify = Bytes::from(verify.concat());
        let data = Bytes::from(data);
        self.call(n, |r, now| {
            r.submit_caw(now, uid, lba, len, fua, verify, data)
        });
    }

    /// Both nodes CAW block 0 from the same expected content to different new data.
    fn start_round(&mut self) {
        if self.now >= self.load_until {
            return;
        }
        let now = self.now;
        let serving: Vec<usize> = (0..2)
            .filter(|&n| self.alive(n) && self.nodes[n].paused_until <= now)
            .collect();
        let (expected, certain) = match self.round_value {
            Some(v) => (Some(v), true),
            None => {
                let reader = serving.iter().copied().find(|&n| {
                    self.nodes[n]
                        .replica
                        .as_ref()
                        .is_some_and(|r| r.read_allowed(now))
                });
                (reader.map(|n| self.nodes[n].disk.read(0)), false)
            }
        };
        let Some(expected) = expected.filter(|_| !serving.is_empty()) else {
            self.at(20 * MS, Ev::Round);
            return;
        };
        let r = self.caws.rounds.len() as u64;
        self.caws.rounds.entry(r).or_default().certain = certain;
        // Registered first, answered (maybe at once) after: the round is over when both are.
        self.round = None;
        for n in serving {
            self.submit_caw(n, 0, &[expected], Some(r));
        }
        self.round = Some(r);
        self.round_step();
    }

    /// After an answer: once the round under way is over, remember block 0's content if
    /// exactly one CAW won cleanly, and start the next round soon.
    fn round_step(&mut self) {
        let Some(r) = self.round else { return };
        let (over, winner) = self.caws.round_over(r);
        if !over {
            return;
        }
        self.round = None;
        self.round_value = winner.map(|w| block_bytes(w, 0));
        let d = self.rng.gen_range(0..3000) * US;
        self.at(d, Ev::Round);
    }
}
