//! The fault campaign's oracle: every 4 KiB write carries (offset, writer, version) and a
//! CRC32C over the whole block, so a read tells which write it returns, or that the block is
//! torn or misplaced. Each slot has one writer that works sequentially, so the oracle knows
//! the version last acknowledged before any read began.

use super::BS;

const MAGIC: &[u8; 8] = b"LANESORC";

/// A block for `offset`, written by `writer` as its `version`.
pub fn block(offset: u64, writer: u64, version: u64) -> Vec<u8> {
    let mut b = super::pattern(offset ^ (version << 32) ^ (writer << 56), BS);
    b[..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&offset.to_le_bytes());
    b[16..24].copy_from_slice(&writer.to_le_bytes());
    b[24..32].copy_from_slice(&version.to_le_bytes());
    let crc = crc(&b);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    b
}

fn crc(b: &[u8]) -> u32 {
    let c = crc32c::crc32c(&b[..32]);
    crc32c::crc32c_append(c, &b[36..])
}

/// What a read returned, decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// All zeros: never written.
    Unwritten,
    Version {
        writer: u64,
        version: u64,
    },
}

/// Decodes a block read at `offset`; `Err` names the violation (torn, misplaced, foreign).
pub fn decode(b: &[u8], offset: u64) -> Result<Seen, String> {
    if b.len() != BS {
        return Err(format!("block at {offset}: {} bytes", b.len()));
    }
    if b.iter().all(|&x| x == 0) {
        return Ok(Seen::Unwritten);
    }
    if &b[..8] != MAGIC {
        return Err(format!(
            "block at {offset}: no oracle header (torn or foreign)"
        ));
    }
    let word = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().unwrap());
    let stored = u32::from_le_bytes(b[32..36].try_into().unwrap());
    if stored != crc(b) {
        return Err(format!("block at {offset}: CRC mismatch (torn sector)"));
    }
    if word(8..16) != offset {
        return Err(format!(
            "block at {offset} holds the block of offset {} (misdirected)",
            word(8..16)
        ));
    }
    Ok(Seen::Version {
        writer: word(16..24),
        version: word(24..32),
    })
}

/// One slot's history as its writer knows it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Slot {
    /// The version last acknowledged (0: none).
    pub acked: u64,
    /// A write whose outcome is unknown (it failed): the slot may hold it.
    pub maybe: Option<u64>,
}

impl Slot {
    /// Checks what a read returned against this slot (`writer` owns it).
    pub fn check(&self, seen: &Seen, writer: u64, offset: u64) -> Result<(), String> {
        let (w, v) = match seen {
            Seen::Unwritten => (writer, 0),
            Seen::Version { writer, version } => (*writer, *version),
        };
        if w != writer {
            return Err(format!("block at {offset}: written by {w}, owner {writer}"));
        }
        if v == self.acked || Some(v) == self.maybe {
            return Ok(());
        }
        if v < self.acked {
            return Err(format!(
                "block at {offset}: version {v}, older than {} acknowledged before the read",
                self.acked
            ));
        }
        Err(format!(
            "block at {offset}: version {v}, never written (acknowledged {})",
            self.acked
        ))
    }

    pub fn acknowledged(&mut self, version: u64) {
        self.acked = version;
        self.maybe = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oracle_sees_stale_torn_and_misplaced_blocks() {
        let b = block(8192, 3, 7);
        let seen = decode(&b, 8192).unwrap();
        assert_eq!(
            seen,
            Seen::Version {
                writer: 3,
                version: 7
            }
        );
        let slot = Slot {
            acked: 7,
            maybe: None,
        };
        assert!(slot.check(&seen, 3, 8192).is_ok());
        let newer = Slot {
            acked: 8,
            maybe: None,
        };
        assert!(newer.check(&seen, 3, 8192).unwrap_err().contains("older"));
        let mut torn = b.clone();
        torn[2048..].copy_from_slice(&block(8192, 3, 8)[2048..]);
        assert!(decode(&torn, 8192).unwrap_err().contains("torn"));
        assert!(decode(&b, 4096).unwrap_err().contains("misdirected"));
        assert_eq!(decode(&[0; BS], 0).unwrap(), Seen::Unwritten);
    }
}
