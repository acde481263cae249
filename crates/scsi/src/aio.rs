//! READ and WRITE on a device with asynchronous I/O ([`blockstore::AsyncBlockIo`], an RBD
//! image through `rbd_aio_*`), and UNMAP, WRITE SAME and COMPARE AND WRITE on one whose
//! storage does those itself ([`blockstore::AsyncBlockIo::has_extended`]): the checks run on
//! the caller's thread, the I/O is submitted, and the returned future ends the command when
//! the storage completes it. No thread waits per command; the command stays under way for a
//! drain ([`crate::drain`]) until it ends. COMPARE AND WRITE is then atomic at the storage
//! (librbd's compare-and-write is, at the OSD), so no local range lock is taken.
//!
//! Only the plain case is taken here, as [`LogicalUnit::execute_nowait`] does: a pending unit
//! attention, a port group that refuses the command, a reservation conflict, a range or field
//! the checks refuse, or a partial block are left to [`LogicalUnit::execute`], which answers
//! them with the right sense data.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use blockstore::aio_pair;
use bytes::{Bytes, BytesMut};

use crate::alua::TargetPortGroups;
use crate::cdb::{decode_cdb, Command};
use crate::lun::LogicalUnit;
use crate::sense::Sense;
use crate::{ScsiOutcome, ScsiRequest};

/// A READ or WRITE submitted to the storage; resolves once the storage has completed it.
pub type Submitted = std::pin::Pin<Box<dyn Future<Output = Ended> + Send>>;

/// How a submitted command ended.
pub struct Ended {
    pub outcome: ScsiOutcome,
    /// The data-in still to send: all of it, or what follows the pieces handed on.
    pub data_in: BytesMut,
    /// Bytes of data-in handed to a [`ReadSink`] before `data_in` (0 unless streamed).
    pub handed: usize,
}

/// Where a READ cut in pieces hands each piece on as soon as it and every piece before it have
/// been read, so the transport sends the first bytes while the storage still reads the last.
pub trait ReadSink: Send {
    /// An empty buffer with room for `len` bytes (the transport's own, for reuse).
    fn buffer(&mut self, len: usize) -> BytesMut;
    /// The piece at byte `offset` of the data-in. `false` once the command is gone (aborted,
    /// its connection closed): nothing more is handed on.
    fn part(&mut self, offset: usize, data: Bytes) -> bool;
}

/// A READ to read in pieces of `piece` bytes, each but the last handed to `sink` in order (the
/// last ends the command, with its status).
pub struct Streamed {
    pub piece: usize,
    pub sink: Box<dyn ReadSink>,
}

fn lost() -> std::io::Error {
    std::io::Error::other("the storage dropped the request")
}

impl LogicalUnit {
    /// Whether READs and WRITEs of this LU may go through [`LogicalUnit::submit`].
    pub fn has_aio(&self) -> bool {
        self.cfg.device.aio().is_some()
    }

    /// Submits a plain READ or WRITE to a device with asynchronous I/O. `Err(data_in)` (the
    /// buffer back, untouched) when the command is not one this path takes: the caller then
    /// runs [`LogicalUnit::execute`] on a blocking thread. A READ longer than `stream`'s piece
    /// (and within the transfer length) is read in pieces handed to its sink as they come.
    pub fn submit(
        self: &Arc<Self>,
        req: &ScsiRequest<'_>,
        mut data_in: BytesMut,
        stream: Option<Streamed>,
    ) -> Result<Submitted, BytesMut> {
        let Some(opcode) = req.cdb.first().copied() else {
            return Err(data_in);
        };
        let Some(aio) = self.cfg.device.aio() else {
            return Err(data_in);
        };
        let extended = crate::cdb::is_done_by_storage(opcode) && aio.has_extended();
        if !crate::cdb::is_read_or_write(opcode) && !extended {
            return Err(data_in);
        }
        let under_way = self.drain.enter_owned();
        self.check_alua_generation();
        if self.ua.any_pending() {
            return Err(data_in);
        }
        let state = self.tpgs.state_of(req.nexus.target_port_group);
        if TargetPortGroups::access_check(state, opcode, 0).is_some() {
            return Err(data_in);
        }
        let Ok(cmd) = decode_cdb(req.cdb) else {
            return Err(data_in);
        };
        if self.pr.conflicts(req.nexus, &cmd) {
            return Err(data_in);
        }
        let bs = u64::from(self.cfg.block_size);
        match cmd {
            Command::Read(r) => {
                if self.check_transfer(&r).is_err() {
                    return Err(data_in);
                }
                let n = (u64::from(r.blocks) * bs) as usize;
                // Pieces only when this READ is the only command under way on the LU: each
                // piece is an operation of the storage's own (about as costly as a whole
                // READ for the OSDs), so with commands queued behind it the storage is
                // better kept busy with whole READs than with one READ's pieces.
                let alone = self.drain.under_way() <= 1;
                if let Some(s) = stream.filter(|s| {
                    alone
                        && s.piece > 0
                        && n > s.piece
                        && data_in.is_empty()
                        && n <= req.data_in_limit as usize
                }) {
                    let lu = self.clone();
                    return Ok(streamed_read(lu, under_way, r.lba * bs, n, data_in, s));
                }
                let start = data_in.len();
                // The device fills a buffer of its own: the capacity after what data_in
                // holds, appended to again once read (nothing zeroed first).
                data_in.reserve(n);
                let buf = data_in.split_off(start);
                let (done, wait) = aio_pair();
                // The LU (and so its device) lives until the command ends.
                let lu = self.clone();
                if let Some(aio) = self.cfg.device.aio() {
                    aio.read(buf, n, r.lba * bs, done);
                }
                Ok(Box::pin(async move {
                    let (_under_way, _lu) = (under_way, lu);
                    match wait.await {
                        Some((Ok(()), buf)) => {
                            data_in.unsplit(buf);
                            ended(ScsiOutcome::good(), data_in)
                        }
                        Some((Err(e), _)) => {
                            data_in.clear();
                            ended(read_failed(&e), data_in)
                        }
                        None => {
                            data_in.clear();
                            ended(read_failed(&lost()), data_in)
                        }
                    }
                }))
            }
            Command::Write(r) => {
                if self.check_writable().is_err() || self.check_transfer(&r).is_err() {
                    return Err(data_in);
                }
                let sent: u64 = req.data_out.iter().map(|b| b.len() as u64).sum();
                let n = (u64::from(r.blocks) * bs).min(sent);
                // Nothing sent (a residual case) or a partial block: the full path answers.
                if n == 0 || !n.is_multiple_of(bs) {
                    return Err(data_in);
                }
                let data = first_segments(req.data_out, n);
                let flush = r.fua || !self.wce.load(Ordering::Relaxed);
                let (done, wait) = aio_pair();
                let lu = self.clone();
                if let Some(aio) = self.cfg.device.aio() {
                    aio.write(data, r.lba * bs, done);
                }
                Ok(Box::pin(async move {
                    let _under_way = under_way;
                    let mut result = wait.await.unwrap_or_else(|| Err(lost()));
                    if result.is_ok() && flush {
                        let (done, wait) = aio_pair();
                        if let Some(aio) = lu.cfg.device.aio() {
                            aio.flush(done);
                        }
                        result = wait.await.unwrap_or_else(|| Err(lost()));
                    }
                    let outcome = match result {
                        Ok(()) => ScsiOutcome::good(),
                        Err(e) => ScsiOutcome::check(Sense::device(&e, Sense::write_error())),
                    };
                    ended(outcome, data_in)
                }))
            }
            Command::WriteSame {
                lba,
                blocks,
                unmap,
                anchor,
                ndob,
            } => {
                let Ok(plan) = self.write_same_plan(req, lba, blocks, unmap, anchor, ndob) else {
                    return Err(data_in);
                };
                let (offset, len) = (plan.lba * bs, plan.blocks * bs);
                let (done, wait) = aio_pair();
                if plan.discard {
                    aio.discard(offset, len, done);
                } else {
                    aio.write_same(Bytes::from(plan.block), offset, len, done);
                }
                let flush = !self.wce.load(Ordering::Relaxed);
                Ok(written(self.clone(), under_way, vec![wait], flush, data_in))
            }
            Command::Unmap { anchor, param_len } => {
                let Ok(ranges) = self.unmap_plan(req, anchor, param_len) else {
                    return Err(data_in);
                };
                // Every range at once; the command ends when the last is done.
                let waits = ranges
                    .into_iter()
                    .map(|(lba, n)| {
                        let (done, wait) = aio_pair();
                        aio.discard(lba * bs, n * bs, done);
                        wait
                    })
                    .collect();
                Ok(written(self.clone(), under_way, waits, false, data_in))
            }
            Command::CompareAndWrite(r) => {
                let Ok(plan) = self.compare_and_write_plan(req, &r) else {
                    return Err(data_in);
                };
                let Some(data) = plan else {
                    return Ok(Box::pin(async move {
                        let _under_way = under_way;
                        ended(ScsiOutcome::good(), data_in)
                    }));
                };
                let mut write = Bytes::from(data);
                let compare = write.split_to(write.len() / 2);
                let (done, wait) = aio_pair();
                aio.compare_and_write(compare, write, r.lba * bs, done);
                let flush = r.fua || !self.wce.load(Ordering::Relaxed);
                let lu = self.clone();
                Ok(Box::pin(async move {
                    let _under_way = under_way;
                    let outcome = match wait.await.unwrap_or_else(|| Err(lost())) {
                        Ok(None) => flushed(&lu, flush).await,
                        Ok(Some(i)) => ScsiOutcome::check(Sense::miscompare(i)),
                        Err(e) => ScsiOutcome::check(Sense::device(&e, Sense::write_error())),
                    };
                    ended(outcome, data_in)
                }))
            }
            _ => Err(data_in),
        }
    }
}

fn ended(outcome: ScsiOutcome, data_in: BytesMut) -> Ended {
    Ended {
        outcome,
        data_in,
        handed: 0,
    }
}

/// A READ of `n` bytes at byte `offset` in pieces, all submitted at once; each but the last is
/// handed to the sink once it and those before it are read. The last is read into `data_in`.
/// A failed piece ends the command with CHECK CONDITION after the pieces before it; every
/// piece is waited for, so the command is under way until the storage is done with it.
fn streamed_read(
    lu: Arc<LogicalUnit>,
    under_way: crate::drain::OwnedTicket,
    offset: u64,
    n: usize,
    mut data_in: BytesMut,
    mut s: Streamed,
) -> Submitted {
    let count = n.div_ceil(s.piece);
    let mut waits = Vec::with_capacity(count);
    if let Some(aio) = lu.cfg.device.aio() {
        for i in 0..count {
            let at = i * s.piece;
            let len = s.piece.min(n - at);
            let mut buf = if i + 1 == count {
                std::mem::take(&mut data_in)
            } else {
                s.sink.buffer(len)
            };
            buf.clear();
            let (done, wait) = aio_pair();
            aio.read(buf, len, offset + at as u64, done);
            waits.push(wait);
        }
    }
    Box::pin(async move {
        let (_under_way, _lu) = (under_way, lu);
        let mut failed: Option<std::io::Error> = None;
        let (mut handed, mut live) = (0usize, true);
        let mut last = BytesMut::new();
        for (i, wait) in waits.into_iter().enumerate() {
            match wait.await {
                Some((Ok(()), buf)) if failed.is_none() => {
                    if i + 1 == count {
                        last = buf;
                    } else if live {
                        let len = buf.len();
                        live = s.sink.part(handed, buf.freeze());
                        handed += len;
                    }
                }
                Some((Ok(()), _)) => {}
                Some((Err(e), _)) => {
                    failed.get_or_insert(e);
                }
                None => {
                    failed.get_or_insert_with(lost);
                }
            }
        }
        let outcome = match failed {
            None => ScsiOutcome::good(),
            Some(e) => {
                last.clear();
                read_failed(&e)
            }
        };
        Ended {
            outcome,
            data_in: last,
            handed,
        }
    })
}

/// Ends a command once every one of `waits` is done (the first failure answers), with a flush
/// after them when `flush`.
fn written(
    lu: Arc<LogicalUnit>,
    under_way: crate::drain::OwnedTicket,
    waits: Vec<blockstore::AioWait<std::io::Result<()>>>,
    flush: bool,
    data_in: BytesMut,
) -> Submitted {
    Box::pin(async move {
        let _under_way = under_way;
        let mut result = Ok(());
        for wait in waits {
            let r = wait.await.unwrap_or_else(|| Err(lost()));
            if result.is_ok() {
                result = r;
            }
        }
        let outcome = match result {
            Ok(()) => flushed(&lu, flush).await,
            Err(e) => ScsiOutcome::check(Sense::device(&e, Sense::write_error())),
        };
        ended(outcome, data_in)
    })
}

/// GOOD, after a flush of the storage when `flush` (FUA, or the write cache off).
async fn flushed(lu: &LogicalUnit, flush: bool) -> ScsiOutcome {
    if flush {
        let (done, wait) = aio_pair();
        if let Some(aio) = lu.cfg.device.aio() {
            aio.flush(done);
        }
        if let Err(e) = wait.await.unwrap_or_else(|| Err(lost())) {
            return ScsiOutcome::check(Sense::device(&e, Sense::write_error()));
        }
    }
    ScsiOutcome::good()
}

fn read_failed(e: &std::io::Error) -> ScsiOutcome {
    ScsiOutcome::check(Sense::device(e, Sense::read_error()))
}

/// The first `n` bytes of the data-out segments (shared, not copied).
fn first_segments(data: &[Bytes], n: u64) -> Vec<Bytes> {
    let mut left = n as usize;
    let mut v = Vec::with_capacity(data.len());
    for seg in data {
        if left == 0 {
            break;
        }
        let take = seg.len().min(left);
        v.push(seg.slice(..take));
        left -= take;
    }
    v
}
