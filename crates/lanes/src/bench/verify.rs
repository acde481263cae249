//! `--verify`: blocks that carry their LBA, a stamp and a checksum, and the table of the
//! stamp each 4 KiB was last written with.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::bail;

pub fn checksum(words: &[u8]) -> u64 {
    // FNV-1a over 8-byte words: cheap, and any misplaced or torn block fails it.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in words.chunks_exact(8) {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Fills `buf` (whole blocks of `bs`) so each block carries its LBA, a stamp and a checksum.
pub fn fill_verified(buf: &mut [u8], lba: u64, bs: usize, stamp: u64) {
    for (i, block) in buf.chunks_exact_mut(bs).enumerate() {
        let this = lba + i as u64;
        let (body, sum) = block.split_at_mut(bs - 8);
        let mut x = this.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ stamp;
        for (j, w) in body.chunks_exact_mut(8).enumerate() {
            let v = match j {
                0 => this,
                1 => stamp,
                _ => {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                }
            };
            w.copy_from_slice(&v.to_le_bytes());
        }
        sum.copy_from_slice(&checksum(body).to_le_bytes());
    }
}

/// Counts the blocks of `buf` that are neither never-written (all zero) nor intact at `lba`
/// with the stamp `expected` gives for their LBA (0: any stamp).
pub fn count_bad_blocks(buf: &[u8], lba: u64, bs: usize, expected: impl Fn(u64) -> u64) -> u64 {
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let mut bad = 0;
    for (i, block) in buf.chunks_exact(bs).enumerate() {
        if block.iter().all(|b| *b == 0) {
            continue;
        }
        let this = lba + i as u64;
        let (body, sum) = block.split_at(bs - 8);
        let want = expected(this);
        if word(&body[..8]) != this
            || word(sum) != checksum(body)
            || (want != 0 && word(&body[8..16]) != want)
        {
            bad += 1;
        }
    }
    bad
}

/// The stamp each 4 KiB grain of the region was last written with (0: unknown), so `--verify`
/// also catches a read returning an older version of a block, not just a misplaced one.
/// Every I/O covers whole grains and each task owns its slice, so plain loads and stores do.
pub struct Oracle {
    grain_blocks: u64,
    stamps: Vec<AtomicU64>,
}

/// The stamp of blocks written by the prefill.
pub const PREFILL_STAMP: u64 = 1;
/// Largest table `--verify` keeps (8 bytes per grain): 64 Mi grains, 256 GiB of region.
const MAX_GRAINS: u64 = 64 << 20;

impl Oracle {
    pub fn new(region_blocks: u64, bs: usize) -> anyhow::Result<Oracle> {
        let grain_blocks = (4096 / bs).max(1) as u64;
        let grains = region_blocks.div_ceil(grain_blocks);
        if grains > MAX_GRAINS {
            bail!("--verify keeps a stamp per 4 KiB and supports up to 256 GiB; use --size");
        }
        Ok(Oracle {
            grain_blocks,
            stamps: (0..grains).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    pub fn expected(&self, lba: u64) -> u64 {
        self.stamps
            .get((lba / self.grain_blocks) as usize)
            .map_or(0, |s| s.load(Ordering::Relaxed))
    }

    pub fn record(&self, lba: u64, blocks: u64, stamp: u64) {
        let first = lba / self.grain_blocks;
        let last = (lba + blocks).div_ceil(self.grain_blocks);
        for g in first..last {
            if let Some(s) = self.stamps.get(g as usize) {
                s.store(stamp, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verification_blocks() {
        let mut b = vec![0u8; 4096];
        fill_verified(&mut b, 100, 512, 7);
        let any = |_| 0;
        assert_eq!(count_bad_blocks(&b, 100, 512, any), 0);
        assert_eq!(count_bad_blocks(&b, 100, 512, |_| 7), 0);
        // An older version of the blocks (stale stamp) is caught.
        assert_eq!(
            count_bad_blocks(&b, 100, 512, |l| if l < 102 { 8 } else { 7 }),
            2
        );
        assert_eq!(count_bad_blocks(&b, 101, 512, any), 8);
        b[600] ^= 1;
        assert_eq!(count_bad_blocks(&b, 100, 512, any), 1);
        assert_eq!(count_bad_blocks(&[0u8; 1024], 5, 512, any), 0);
    }

    #[test]
    fn oracle_tracks_grains() {
        let o = Oracle::new(1000, 512).unwrap();
        assert_eq!(o.expected(17), 0);
        o.record(16, 16, 9);
        assert_eq!(
            (
                o.expected(15),
                o.expected(16),
                o.expected(31),
                o.expected(32)
            ),
            (0, 9, 9, 0)
        );
        o.record(990, 10, 4);
        assert_eq!(o.expected(999), 4);
        assert!(Oracle::new(u64::MAX / 2, 512).is_err());
    }
}
