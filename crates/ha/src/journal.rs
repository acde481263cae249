//! The per-LUN metadata journal: the core's `MetaOp`s appended to a file and made durable
//! with fdatasync, in order, by one thread (group commit: every op queued while a sync runs
//! goes into the next one).
//!
//! ```text
//! file   := header record*
//! header := "LNSHAMJ1" regions:u64le al_slots:u32le crc:u32le
//! record := tag:u8 payload crc:u32le      (crc32c over tag and payload)
//! ```
//!
//! Loading replays the records into a [`Meta`]; a torn or corrupt record ends the journal
//! there (it was never reported durable) and the file is cut back to the last good record.
//! Once the journal holds many records it is rewritten as a snapshot (the same records,
//! describing the current state) into a temporary file that replaces it atomically.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use replication::{Generations, Meta, MetaOp, Token};

const MAGIC: &[u8; 8] = b"LNSHAMJ1";
const HEADER: usize = 8 + 8 + 4 + 4;
/// Records after which the journal is compacted.
const COMPACT_AFTER: u64 = 1 << 16;

/// Why the journal cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a lanes metadata journal, or for another LUN geometry ({reason})")]
    Foreign { path: String, reason: String },
}

fn io(path: &Path, source: std::io::Error) -> JournalError {
    JournalError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Geometry the journal belongs to, and what a new one starts from.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub regions: u64,
    pub al_slots: usize,
    /// Dirty-bitmap regions per activity-log extent (to resize the log of an existing
    /// journal: see [`Journal::open`]).
    pub extent_regions: u64,
    /// Generation of a new journal (both nodes of a new pair start equal).
    pub initial_generation: u64,
    /// A new journal starts outdated (a replacement disk that must be resynced in full).
    pub initial_outdated: bool,
}

fn header(g: &Geometry) -> Vec<u8> {
    header_with(g.regions, g.al_slots)
}

fn header_with(regions: u64, al_slots: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&regions.to_le_bytes());
    h.extend_from_slice(&(al_slots as u32).to_le_bytes());
    let crc = crc32c::crc32c(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

fn encode(op: &MetaOp, out: &mut Vec<u8>) {
    let start = out.len();
    match *op {
        MetaOp::AlSet { slot, extent } => {
            out.push(1);
            out.extend_from_slice(&slot.to_le_bytes());
            out.extend_from_slice(&extent.unwrap_or(u64::MAX).to_le_bytes());
        }
        MetaOp::BitsSet { first, count } | MetaOp::BitsClear { first, count } => {
            out.push(if matches!(op, MetaOp::BitsSet { .. }) {
                2
            } else {
                3
            });
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
        }
        MetaOp::BitsClearAll => out.push(4),
        MetaOp::Gens(g) => {
            out.push(5);
            for v in [g.current, g.bitmap, g.history[0], g.history[1]] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        MetaOp::State { epoch, outdated } => {
            out.push(6);
            out.extend_from_slice(&epoch.to_le_bytes());
            out.push(u8::from(outdated));
        }
    }
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
}

/// One record from the start of `b`: the op and its length, or None if torn or corrupt.
fn decode(b: &[u8]) -> Option<(MetaOp, usize)> {
    let payload = match *b.first()? {
        1 => 12,
        2 | 3 => 16,
        4 => 0,
        5 => 32,
        6 => 9,
        _ => return None,
    };
    let body = b.get(..1 + payload)?;
    let crc = b.get(1 + payload..5 + payload)?;
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return None;
    }
    let p = &body[1..];
    let op = match body[0] {
        1 => {
            let slot = u32::from_le_bytes(p.get(..4)?.try_into().ok()?);
            let e = u64_at(p, 4)?;
            MetaOp::AlSet {
                slot,
                extent: (e != u64::MAX).then_some(e),
            }
        }
        2 => MetaOp::BitsSet {
            first: u64_at(p, 0)?,
            count: u64_at(p, 8)?,
        },
        3 => MetaOp::BitsClear {
            first: u64_at(p, 0)?,
            count: u64_at(p, 8)?,
        },
        4 => MetaOp::BitsClearAll,
        5 => MetaOp::Gens(Generations {
            current: u64_at(p, 0)?,
            bitmap: u64_at(p, 8)?,
            history: [u64_at(p, 16)?, u64_at(p, 24)?],
        }),
        _ => MetaOp::State {
            epoch: u64_at(p, 0)?,
            outdated: *p.get(8)? != 0,
        },
    };
    Some((op, 5 + payload))
}

/// The records that describe `meta` from scratch.
fn snapshot(meta: &Meta) -> Vec<MetaOp> {
    let mut ops = vec![
        MetaOp::Gens(meta.gens),
        MetaOp::State {
            epoch: meta.epoch,
            outdated: meta.outdated,
        },
    ];
    let bits = meta.bitmap.len() as u64 * 64;
    let mut i = 0;
    while let Some(first) = replication::meta::next_set(&meta.bitmap, i) {
        let mut end = first + 1;
        while end < bits && replication::meta::get_bit(&meta.bitmap, end) {
            end += 1;
        }
        ops.push(MetaOp::BitsSet {
            first,
            count: end - first,
        });
        i = end;
    }
    for (slot, e) in meta.al.iter().enumerate() {
        if let Some(extent) = *e {
            ops.push(MetaOp::AlSet {
                slot: slot as u32,
                extent: Some(extent),
            });
        }
    }
    ops
}

/// `meta` with an activity log of `g.al_slots` slots: its extents kept (packed into the first
/// slots); those that no longer fit are marked in the dirty bitmap instead, so a resync
/// copies them whole where it would have compared them. Never less than the old log covered.
fn resized(meta: &Meta, g: &Geometry) -> Meta {
    let mut m = meta.clone();
    m.al = vec![None; g.al_slots];
    for (i, e) in meta.al.iter().flatten().enumerate() {
        match m.al.get_mut(i) {
            Some(slot) => *slot = Some(*e),
            None => {
                let first = e.saturating_mul(g.extent_regions);
                let count = g.extent_regions.min(g.regions.saturating_sub(first));
                m.apply(&MetaOp::BitsSet { first, count });
            }
        }
    }
    m
}

/// The open journal (owned by the journal thread after [`Journal::open`]).
pub struct Journal {
    path: PathBuf,
    file: File,
    geometry: Geometry,
    meta: Meta,
    records: u64,
    buf: Vec<u8>,
}

impl Journal {
    /// Open (or create) the journal at `path` and replay it.
    pub fn open(path: &Path, geometry: Geometry) -> Result<Journal, JournalError> {
        let mut meta = Meta::new(
            geometry.regions,
            geometry.al_slots,
            geometry.initial_generation,
        );
        let mut bytes = Vec::new();
        match File::open(path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes).map_err(|e| io(path, e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(path, e)),
        }
        let mut j = if bytes.len() < HEADER {
            // New (or torn before its header was durable: nothing was ever reported).
            meta.outdated = geometry.initial_outdated;
            let mut j = Journal::create(path, geometry, meta)?;
            j.rewrite()?;
            j
        } else {
            // The activity log's size may change between runs (`activity-log-extents`);
            // nothing else in the header may.
            let stored = bytes
                .get(16..20)
                .and_then(|b| b.try_into().ok())
                .map_or(0, |b| u32::from_le_bytes(b) as usize);
            let resize = stored != geometry.al_slots
                && stored >= 2
                && bytes[..HEADER] == header_with(geometry.regions, stored)[..];
            if bytes[..HEADER] != header(&geometry)[..] && !resize {
                return Err(JournalError::Foreign {
                    path: path.display().to_string(),
                    reason: "header mismatch".into(),
                });
            }
            if resize {
                meta.al = vec![None; stored];
            }
            let mut at = HEADER;
            let mut records = 0;
            while let Some((op, n)) = bytes.get(at..).and_then(decode) {
                meta.apply(&op);
                at += n;
                records += 1;
            }
            // Append mode: records go after the last good one (a plain write handle would
            // start at offset 0 and overwrite the header).
            let file = OpenOptions::new()
                .append(true)
                .open(path)
                .map_err(|e| io(path, e))?;
            if at < bytes.len() {
                tracing::warn!(path = %path.display(), at, len = bytes.len(), "metadata journal: torn tail cut");
                file.set_len(at as u64).map_err(|e| io(path, e))?;
                file.sync_data().map_err(|e| io(path, e))?;
            }
            Journal {
                path: path.to_path_buf(),
                file,
                geometry,
                meta,
                records,
                buf: Vec::with_capacity(4096),
            }
        };
        if j.meta.al.len() != geometry.al_slots {
            let from = j.meta.al.len();
            j.meta = resized(&j.meta, &geometry);
            tracing::warn!(path = %path.display(), from, to = geometry.al_slots, "metadata journal: activity log resized");
            j.rewrite()?;
        } else if j.records > COMPACT_AFTER / 2 {
            j.rewrite()?;
        }
        Ok(j)
    }

    fn create(path: &Path, geometry: Geometry, meta: Meta) -> Result<Journal, JournalError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)
            .map_err(|e| io(path, e))?;
        Ok(Journal {
            path: path.to_path_buf(),
            file,
            geometry,
            meta,
            records: 0,
            buf: Vec::with_capacity(4096),
        })
    }

    /// The state the journal describes.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Append `ops` and make them durable.
    pub fn append(&mut self, ops: &[MetaOp]) -> Result<(), JournalError> {
        self.buf.clear();
        for op in ops {
            encode(op, &mut self.buf);
            self.meta.apply(op);
        }
        self.file
            .write_all(&self.buf)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| io(&self.path, e))?;
        self.records += ops.len() as u64;
        if self.records >= COMPACT_AFTER {
            self.rewrite()?;
        }
        Ok(())
    }

    /// Replace the file by a snapshot of the current state.
    fn rewrite(&mut self) -> Result<(), JournalError> {
        let tmp = self.path.with_extension("tmp");
        let ops = snapshot(&self.meta);
        let mut b = header(&self.geometry);
        for op in &ops {
            encode(op, &mut b);
        }
        let mut f = File::create(&tmp).map_err(|e| io(&tmp, e))?;
        f.write_all(&b)
            .and_then(|()| f.sync_all())
            .map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| io(&self.path, e))?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io(dir, e))?;
        }
        self.file = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| io(&self.path, e))?;
        self.records = ops.len() as u64;
        Ok(())
    }
}

/// Run the journal on its own thread: `(token, op)` in, `Ok(token)` out once every op through
/// `token` is durable (or the error that stops it).
pub fn spawn(
    mut journal: Journal,
    rx: std::sync::mpsc::Receiver<(Token, MetaOp)>,
    done: impl Fn(Result<Token, JournalError>) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("lanes-ha-journal".into())
        .spawn(move || {
            let mut ops = Vec::with_capacity(256);
            while let Ok((token, op)) = rx.recv() {
                ops.clear();
                ops.push(op);
                let mut last = token;
                while let Ok((t, op)) = rx.try_recv() {
                    ops.push(op);
                    last = t;
                }
                match journal.append(&ops) {
                    Ok(()) => done(Ok(last)),
                    Err(e) => {
                        done(Err(e));
                        return;
                    }
                }
            }
        })
        .unwrap_or_else(|e| panic!("cannot start the journal thread: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            regions: 1000,
            al_slots: 7,
            extent_regions: 10,
            initial_generation: 1,
            initial_outdated: false,
        }
    }

    #[test]
    fn replays_what_was_appended_and_cuts_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta");
        let mut j = Journal::open(&path, geo()).unwrap();
        let ops = [
            MetaOp::BitsSet {
                first: 10,
                count: 70,
            },
            MetaOp::AlSet {
                slot: 3,
                extent: Some(9),
            },
            MetaOp::State {
                epoch: 4,
                outdated: true,
            },
            MetaOp::BitsClear {
                first: 20,
                count: 5,
            },
        ];
        j.append(&ops).unwrap();
        let want = j.meta().clone();
        drop(j);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[2, 1, 2, 3]).unwrap();
        drop(f);
        let j = Journal::open(&path, geo()).unwrap();
        assert_eq!(j.meta(), &want);
        assert_eq!(replication::meta::count_set(&j.meta().bitmap), 65);
        assert_eq!(j.meta().al[3], Some(9));
        assert!(j.meta().outdated && j.meta().epoch == 4);
        let mut j = j;
        j.rewrite().unwrap();
        drop(j);
        assert_eq!(Journal::open(&path, geo()).unwrap().meta(), &want);
        let other = Geometry {
            regions: 999,
            ..geo()
        };
        assert!(matches!(
            Journal::open(&path, other),
            Err(JournalError::Foreign { .. })
        ));
    }

    /// A node restarted twice (the fault campaign's kill -9, restart, kill -9, restart): what
    /// it appended after the first restart is replayed after the second.
    #[test]
    fn appends_after_a_reopen_follow_the_replayed_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta");
        let mut j = Journal::open(&path, geo()).unwrap();
        j.append(&[MetaOp::BitsSet { first: 1, count: 2 }]).unwrap();
        drop(j);
        let mut j = Journal::open(&path, geo()).unwrap();
        j.append(&[MetaOp::State {
            epoch: 9,
            outdated: false,
        }])
        .unwrap();
        let want = j.meta().clone();
        drop(j);
        let j = Journal::open(&path, geo()).expect("the header survives a reopen and an append");
        assert_eq!(j.meta(), &want);
        assert_eq!(j.meta().epoch, 9);
        assert_eq!(replication::meta::count_set(&j.meta().bitmap), 2);
    }

    /// `activity-log-extents` changed between runs: a larger log keeps every extent; a
    /// smaller one keeps what fits and marks the rest dirty (copied whole by the next resync
    /// instead of compared), and the header says the new size from then on.
    #[test]
    fn the_activity_log_is_resized_without_losing_an_extent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta");
        let mut j = Journal::open(&path, geo()).unwrap();
        let ops: Vec<MetaOp> = [(0, 4), (2, 9), (5, 99), (6, 50)]
            .into_iter()
            .map(|(slot, e)| MetaOp::AlSet {
                slot,
                extent: Some(e),
            })
            .chain([MetaOp::BitsSet { first: 0, count: 3 }])
            .collect();
        j.append(&ops).unwrap();
        drop(j);
        let extents = |j: &Journal| j.meta().al.iter().flatten().copied().collect::<Vec<_>>();
        let bigger = Geometry {
            al_slots: 12,
            ..geo()
        };
        let j = Journal::open(&path, bigger).unwrap();
        assert_eq!(j.meta().al.len(), 12);
        assert_eq!(extents(&j), [4, 9, 99, 50]);
        assert_eq!(replication::meta::count_set(&j.meta().bitmap), 3);
        drop(j);
        let smaller = Geometry {
            al_slots: 2,
            ..geo()
        };
        let j = Journal::open(&path, smaller).unwrap();
        assert_eq!(extents(&j), [4, 9]);
        // Extent 99 (regions 990..1000, the last ten) and 50 (500..510) are now dirty.
        let bits = &j.meta().bitmap;
        assert!((990..1000)
            .chain(500..510)
            .all(|r| replication::meta::get_bit(bits, r)));
        assert_eq!(replication::meta::count_set(bits), 3 + 20);
        let want = j.meta().clone();
        drop(j);
        // The new size is the journal's own now: reopened alike, and the old size is a change.
        assert_eq!(Journal::open(&path, smaller).unwrap().meta(), &want);
        let other = Geometry {
            regions: 999,
            ..smaller
        };
        assert!(matches!(
            Journal::open(&path, other),
            Err(JournalError::Foreign { .. })
        ));
    }
}
