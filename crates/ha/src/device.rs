//! The replicated LUN as a [`BlockDevice`]: writes and flushes go through the core task;
//! reads are served from the local disk when the core allows it. READ, WRITE and flush have
//! an asynchronous side ([`AsyncBlockIo`]): the core's answer completes the SCSI command's
//! request, so no thread waits for the peer; the synchronous calls (COMPARE AND WRITE, UNMAP,
//! the paths that need them) block a blocking-pool thread until the core answers.
//!
//! UNMAP (`punch_hole`) is replicated as a write of zeros, so both disks keep reading the same
//! bytes and resync needs no notion of holes; the allocation map therefore reports the whole
//! range allocated.

use std::io;
use std::sync::mpsc::sync_channel;
use std::sync::Arc;

use blockstore::{AioCompletion, AsyncBlockIo, BlockDevice, Extent, ReadDone};
use bytes::{Bytes, BytesMut};
use replication::{CawOutcome, HostError};
use tokio::sync::mpsc;

use crate::reply::{Gather, ReadReply, Reply};
use crate::task::Input;

/// Largest piece a host write is split into (well below the peer link's frame limit and the
/// activity log's span).
const CHUNK: usize = 4 << 20;
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

pub(crate) struct ReplicatedDevice {
    pub inputs: mpsc::UnboundedSender<Input>,
    pub local: Arc<dyn BlockDevice>,
    pub block_size: u64,
    pub size: u64,
}

fn stopped() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "replicated LUN stopped")
}

fn host_error(e: HostError) -> io::Error {
    let kind = match e {
        HostError::Invalid => io::ErrorKind::InvalidInput,
        HostError::Busy => io::ErrorKind::WouldBlock,
        // NOT READY, TARGET PORT IN UNAVAILABLE STATE at the SCSI layer: the host retries
        // (on another path). A CAW whose outcome the peer's loss made unknown goes there too.
        HostError::NotReady | HostError::Fenced | HostError::Aborted | HostError::Indeterminate => {
            io::ErrorKind::NotConnected
        }
    };
    io::Error::new(kind, e)
}

impl ReplicatedDevice {
    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = offset.checked_add(len).filter(|&e| e <= self.size);
        if end.is_none()
            || !offset.is_multiple_of(self.block_size)
            || !len.is_multiple_of(self.block_size)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unaligned or out-of-range request on a replicated LUN",
            ));
        }
        Ok(())
    }

    /// `data` at `offset` cut into pieces the core takes (at most CHUNK bytes each).
    fn pieces(&self, mut all: Bytes, offset: u64) -> Vec<(u64, Bytes)> {
        let chunk = CHUNK - CHUNK % self.block_size as usize;
        let mut pieces = Vec::with_capacity(all.len().div_ceil(chunk));
        let mut at = offset;
        while !all.is_empty() {
            let piece = all.split_to(chunk.min(all.len()));
            let n = piece.len() as u64;
            pieces.push((at, piece));
            at += n;
        }
        pieces
    }

    fn write_input(&self, offset: u64, data: Bytes, reply: Reply) -> Input {
        Input::Write {
            lba: offset / self.block_size,
            blocks: (data.len() as u64 / self.block_size) as u32,
            fua: false,
            data,
            reply,
        }
    }

    /// Submit `pieces` (offset, data) as host writes and wait for every acknowledgement.
    fn write_pieces(&self, pieces: Vec<(u64, Bytes)>) -> io::Result<()> {
        let (tx, rx) = sync_channel(pieces.len());
        let n = pieces.len();
        for (offset, data) in pieces {
            let input = self.write_input(offset, data, Reply::Wait(tx.clone()));
            self.inputs.send(input).map_err(|_| stopped())?;
        }
        drop(tx);
        let mut result = Ok(());
        for _ in 0..n {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = result.and(Err(host_error(e))),
                Err(_) => return Err(stopped()),
            }
        }
        result
    }
}

impl BlockDevice for ReplicatedDevice {
    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let (tx, rx) = sync_channel(1);
        self.inputs
            .send(Input::ReadCheck {
                reply: ReadReply::Wait(tx),
            })
            .map_err(|_| stopped())?;
        match rx.recv() {
            Ok(true) => self.local.read_at(buf, offset),
            Ok(false) => Err(host_error(HostError::NotReady)),
            Err(_) => Err(stopped()),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_vectored_at(&[buf], offset)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        self.check(offset, len as u64)?;
        if len == 0 {
            return Ok(());
        }
        let mut all = BytesMut::with_capacity(len);
        for b in bufs {
            all.extend_from_slice(b);
        }
        self.write_pieces(self.pieces(all.freeze(), offset))
    }

    fn flush(&self) -> io::Result<()> {
        let (tx, rx) = sync_channel(1);
        self.inputs
            .send(Input::Flush {
                reply: Reply::Wait(tx),
            })
            .map_err(|_| stopped())?;
        match rx.recv() {
            Ok(r) => r.map_err(host_error),
            Err(_) => Err(stopped()),
        }
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        let piece = (ZEROS.len() as u64) - ZEROS.len() as u64 % self.block_size;
        let mut pieces = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let n = piece.min(offset + len - at);
            pieces.push((at, Bytes::from_static(&ZEROS[..n as usize])));
            at += n;
        }
        // Bounded batches keep a large UNMAP from flooding the core's queue.
        for batch in pieces.chunks(64) {
            self.write_pieces(batch.to_vec())?;
        }
        Ok(())
    }

    fn allocation_map(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.check(offset, len)?;
        Ok(vec![Extent {
            offset,
            len,
            allocated: true,
        }])
    }

    fn release(&self) {
        self.local.release();
    }

    /// COMPARE AND WRITE atomic across both nodes: the pair's leader executes it (this node
    /// forwards it when it follows), ordered with every write of both nodes.
    fn compare_and_write(
        &self,
        compare: &[u8],
        write: &[u8],
        offset: u64,
    ) -> Option<io::Result<Option<u64>>> {
        if let Err(e) = self.check(offset, write.len() as u64) {
            return Some(Err(e));
        }
        if compare.len() != write.len() || write.is_empty() {
            return Some(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "COMPARE AND WRITE: verify and write data differ in length",
            )));
        }
        let (tx, rx) = sync_channel(1);
        let input = Input::Caw {
            lba: offset / self.block_size,
            blocks: (write.len() as u64 / self.block_size) as u32,
            verify: Bytes::copy_from_slice(compare),
            write: Bytes::copy_from_slice(write),
            reply: tx,
        };
        if self.inputs.send(input).is_err() {
            return Some(Err(stopped()));
        }
        Some(match rx.recv() {
            Ok(Ok(CawOutcome::Written)) => Ok(None),
            Ok(Ok(CawOutcome::Miscompare(i))) => Ok(Some(i)),
            Ok(Err(e)) => Err(host_error(e)),
            Err(_) => Err(stopped()),
        })
    }

    fn aio(&self) -> Option<&dyn AsyncBlockIo> {
        Some(self)
    }

    /// Every write waits for the peer's acknowledgement.
    fn writes_stay_local(&self) -> bool {
        false
    }

    /// The core replicates whole blocks.
    fn writes_partial_blocks(&self) -> bool {
        false
    }
}

/// Reads this size or smaller are copied from the page cache on the core task when the lease
/// allows them (a memory copy of a few microseconds); larger ones and cache misses go to a
/// blocking thread, so the core task never waits for the disk.
const INLINE_READ: usize = 64 << 10;

impl AsyncBlockIo for ReplicatedDevice {
    fn read(&self, mut buf: BytesMut, len: usize, offset: u64, done: AioCompletion<ReadDone>) {
        if let Err(e) = self.check(offset, len as u64) {
            return done.complete((Err(e), buf));
        }
        // The local file is read through `&mut [u8]`: the bytes are made first.
        let start = buf.len();
        buf.resize(start + len, 0);
        let local = self.local.clone();
        let next = move |allowed: bool| {
            if !allowed {
                return done.complete((Err(host_error(HostError::NotReady)), buf));
            }
            if len <= INLINE_READ && local.read_at_nowait(&mut buf[start..], offset).is_ok() {
                return done.complete((Ok(()), buf));
            }
            tokio::task::spawn_blocking(move || {
                let r = local.read_at(&mut buf[start..], offset);
                done.complete((r, buf));
            });
        };
        let input = Input::ReadCheck {
            reply: ReadReply::Then(Box::new(next)),
        };
        // The core task is gone: the closure ends the request as refused.
        if let Err(mpsc::error::SendError(Input::ReadCheck { reply })) = self.inputs.send(input) {
            reply.send(false);
        }
    }

    fn write(&self, data: Vec<Bytes>, offset: u64, done: AioCompletion<io::Result<()>>) {
        let len: usize = data.iter().map(|b| b.len()).sum();
        if let Err(e) = self.check(offset, len as u64) {
            return done.complete(Err(e));
        }
        if len == 0 {
            return done.complete(Ok(()));
        }
        // One segment (the usual case) goes as it is; several are joined once.
        let all = match <[Bytes; 1]>::try_from(data) {
            Ok([one]) => one,
            Err(data) => {
                let mut all = BytesMut::with_capacity(len);
                for b in &data {
                    all.extend_from_slice(b);
                }
                all.freeze()
            }
        };
        let pieces = self.pieces(all, offset);
        let gather = Gather::new(pieces.len(), done, host_error);
        for (at, piece) in pieces {
            let input = self.write_input(at, piece, Reply::Aio(gather.clone()));
            if self.inputs.send(input).is_err() {
                return gather.fail(stopped());
            }
        }
    }

    fn flush(&self, done: AioCompletion<io::Result<()>>) {
        let reply = Reply::Aio(Gather::new(1, done, host_error));
        // A send that fails drops the reply, which answers "stopped".
        let _ = self.inputs.send(Input::Flush { reply });
    }
}
