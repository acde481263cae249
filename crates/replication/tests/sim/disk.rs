//! A virtual disk with a volatile write cache, and a metadata store.

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::Rng;
use replication::{Meta, MetaOp, Token};

use super::oracle::BLOCK;

pub struct Disk {
    durable: Vec<[u8; BLOCK]>,
    cache: Vec<Option<[u8; BLOCK]>>,
}

impl Disk {
    pub fn new(blocks: u64) -> Disk {
        Disk {
            durable: vec![[0; BLOCK]; blocks as usize],
            cache: vec![None; blocks as usize],
        }
    }

    pub fn read(&self, b: u64) -> [u8; BLOCK] {
        self.cache[b as usize].unwrap_or(self.durable[b as usize])
    }

    pub fn write(&mut self, lba: u64, data: &[u8], fua: bool) {
        for (i, chunk) in data.chunks_exact(BLOCK).enumerate() {
            let b = lba as usize + i;
            let mut blk = [0; BLOCK];
            blk.copy_from_slice(chunk);
            if fua {
                self.durable[b] = blk;
                self.cache[b] = None;
            } else {
                self.cache[b] = Some(blk);
            }
        }
    }

    pub fn fsync(&mut self) {
        for (d, c) in self.durable.iter_mut().zip(self.cache.iter_mut()) {
            if let Some(x) = c.take() {
                *d = x;
            }
        }
    }

    /// Power loss: each cached block independently reached the platter or not.
    pub fn power_loss(&mut self, rng: &mut StdRng) {
        for (d, c) in self.durable.iter_mut().zip(self.cache.iter_mut()) {
            if let Some(x) = c.take() {
                if rng.gen_bool(0.5) {
                    *d = x;
                }
            }
        }
    }

    /// Deliberate damage, for the oracle's own tests.
    pub fn corrupt(&mut self, b: u64, with: [u8; BLOCK]) {
        self.durable[b as usize] = with;
        self.cache[b as usize] = None;
    }
}

/// The metadata journal: durable state plus entries not yet written.
pub struct MetaStore {
    pub durable: Meta,
    pending: VecDeque<(Token, MetaOp)>,
}

impl MetaStore {
    pub fn new(meta: Meta) -> MetaStore {
        MetaStore {
            durable: meta,
            pending: VecDeque::new(),
        }
    }

    pub fn append(&mut self, token: Token, op: MetaOp) {
        self.pending.push_back((token, op));
    }

    pub fn complete(&mut self, token: Token) {
        while self.pending.front().is_some_and(|&(t, _)| t <= token) {
            if let Some((_, op)) = self.pending.pop_front() {
                self.durable.apply(&op);
            }
        }
    }

    /// A crash: entries not yet written are lost.
    pub fn crash(&mut self) {
        self.pending.clear();
    }
}
