//! The oracle: what the host saw, and the invariants every run must keep.
//!
//! Every written block carries `(write uid, block index, crc32c)`, so a block read back names
//! the write it came from, and a torn or misplaced block is recognised.

use std::collections::{BTreeMap, BTreeSet};

pub const BLOCK: usize = 16;

/// The content of block `i` of write `uid`.
pub fn block_bytes(uid: u64, i: u32) -> [u8; BLOCK] {
    let mut b = [0u8; BLOCK];
    b[..8].copy_from_slice(&uid.to_le_bytes());
    b[8..12].copy_from_slice(&i.to_le_bytes());
    let crc = crc32c::crc32c(&b[..12]);
    b[12..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The write a block came from (0: never written), or None if it is torn or garbage.
pub fn parse_block(b: &[u8]) -> Option<(u64, u32)> {
    if b.iter().all(|&x| x == 0) {
        return Some((0, 0));
    }
    let crc = u32::from_le_bytes(b[12..16].try_into().ok()?);
    if crc32c::crc32c(&b[..12]) != crc {
        return None;
    }
    Some((
        u64::from_le_bytes(b[..8].try_into().ok()?),
        u32::from_le_bytes(b[8..12].try_into().ok()?),
    ))
}

#[derive(Debug, Clone)]
pub struct WriteRec {
    pub node: usize,
    pub lba: u64,
    pub blocks: u32,
    pub fua: bool,
    pub submit: u64,
    /// When the host got its answer, and whether it was success.
    pub done: Option<(u64, bool)>,
}

#[derive(Default)]
pub struct Oracle {
    pub writes: BTreeMap<u64, WriteRec>,
    /// Per block: uids of the writes that cover it.
    pub per_block: Vec<Vec<u64>>,
    /// (submit, ack) of successful flushes.
    pub flushes: Vec<(u64, u64)>,
    pub power_losses: Vec<u64>,
    /// Which node acknowledged writes alone in each epoch.
    pub alone: BTreeMap<u64, usize>,
    pub violations: Vec<String>,
    pub reads_checked: u64,
    pub acked: u64,
    /// COMPARE AND WRITEs that miscompared: their data must never be found.
    pub nowrite: BTreeSet<u64>,
}

impl Oracle {
    pub fn new(blocks: u64) -> Oracle {
        Oracle {
            per_block: vec![Vec::new(); blocks as usize],
            ..Default::default()
        }
    }

    pub fn violation(&mut self, v: String) {
        if self.violations.len() < 20 {
            self.violations.push(v);
        }
    }

    pub fn submit(&mut self, uid: u64, node: usize, lba: u64, blocks: u32, fua: bool, now: u64) {
        self.writes.insert(
            uid,
            WriteRec {
                node,
                lba,
                blocks,
                fua,
                submit: now,
                done: None,
            },
        );
        for b in lba..lba + u64::from(blocks) {
            self.per_block[b as usize].push(uid);
        }
    }

    pub fn answered(&mut self, uid: u64, ok: bool, now: u64) {
        match self.writes.get_mut(&uid) {
            Some(w) if w.done.is_none() => {
                w.done = Some((now, ok));
                if ok {
                    self.acked += 1;
                }
            }
            Some(_) => self.violation(format!("write {uid} answered twice")),
            None => self.violation(format!("unknown write {uid} answered")),
        }
    }

    pub fn alone_ack(&mut self, epoch: u64, node: usize) {
        if let Some(&other) = self.alone.get(&epoch) {
            if other != node {
                self.violation(format!(
                    "nodes {other} and {node} both acknowledged alone in epoch {epoch}"
                ));
            }
        } else {
            self.alone.insert(epoch, node);
        }
    }

    /// When version `uid` was acknowledged (0, the initial zeros, at time 0).
    pub fn acked_at(&self, uid: u64) -> Option<u64> {
        if uid == 0 {
            return Some(0);
        }
        match self.writes.get(&uid)?.done {
            Some((t, true)) => Some(t),
            _ => None,
        }
    }

    /// `must_survive` by uid (the initial zeros always do, until overwritten).
    pub fn must_survive_uid(&self, uid: u64, t: u64) -> bool {
        uid == 0
            || self
                .writes
                .get(&uid)
                .is_some_and(|w| self.must_survive(w, t))
    }

    /// Whether acknowledged write `w` must still be visible at time `t` (power losses forgive
    /// writes that were not yet durable).
    fn must_survive(&self, w: &WriteRec, t: u64) -> bool {
        let Some((ack, true)) = w.done else {
            return false;
        };
        if ack >= t {
            return false;
        }
        let Some(&p) = self.power_losses.iter().find(|&&p| p > ack && p < t) else {
            return true;
        };
        w.fua || self.flushes.iter().any(|&(s, a)| s >= ack && a <= p)
    }

    /// Check the version `uid` found in block `b` by a read (or the final state) at time `t`:
    /// it is a real version of this block, and no write acknowledged before `t` that must
    /// survive strictly follows it.
    pub fn check_block(&mut self, b: u64, data: &[u8], t: u64, what: &str) {
        let Some((uid, idx)) = parse_block(data) else {
            self.violation(format!("{what}: torn block {b} at {t}"));
            return;
        };
        if self.nowrite.contains(&uid) {
            self.violation(format!(
                "{what}: block {b} at {t} holds CAW {uid}, which miscompared"
            ));
            return;
        }
        // When the found version completed (never: it may land any time).
        let completed = if uid == 0 {
            0
        } else {
            match self.writes.get(&uid) {
                Some(w) if w.lba + u64::from(idx) == b && idx < w.blocks && w.submit <= t => {
                    w.done.map_or(u64::MAX, |d| d.0)
                }
                _ => {
                    self.violation(format!(
                        "{what}: block {b} holds write {uid} block {idx}, which never went there"
                    ));
                    return;
                }
            }
        };
        for &other in &self.per_block[b as usize] {
            let w = &self.writes[&other];
            if other != uid && w.submit > completed && self.must_survive(w, t) {
                let msg = format!(
                    "{what}: block {b} at {t} holds write {uid} (done {completed}), older than write {other} (submitted {}, acked {:?} on node {})",
                    w.submit, w.done, w.node
                );
                self.violation(msg);
                return;
            }
        }
    }
}
