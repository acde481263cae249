//! One connection's plumbing: the state shared by the session's callers and its two tasks,
//! the writer task (every PDU in queue order, which is CmdSN order), and the reader task that
//! demultiplexes the target's PDUs by ITT: Data-In into the command's buffer, status to its
//! waiter, R2T answered with Data-Out, NOP-In pings answered, StatSN and MaxCmdSN tracked.

use bytes::{BufMut, Bytes, BytesMut};
use iscsi_proto::pdu::*;
use iscsi_proto::vectored::{ChunkCursor, MAX_SLICES};
use iscsi_proto::{serial, Framer};
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::session::ScsiOutcome;
use crate::Error;

/// Least buffer space offered to each socket read, so one read can take several PDUs (64k
/// sequential reads: 1.4 GB/s with 64 KiB, 2 GB/s and more from 512 KiB up, on loopback). A
/// read returned without copying keeps its chunk alive until the caller drops it.
const READ_CHUNK: usize = 1 << 20;

/// Data-In segments at least this long that have not all arrived yet are read from the socket
/// straight into their command's buffer (`read_data_in_direct`): each byte is copied once,
/// not into the receive buffer first and then into the command's.
const DIRECT_MIN: usize = 64 * 1024;

/// A command waiting for its answer.
pub(crate) struct Pending {
    /// Data to send on R2T (empty for reads).
    pub(crate) write: Bytes,
    /// Data-In collected so far, and the most the command may receive.
    pub(crate) read: ReadBuffer,
    pub(crate) expected: usize,
    /// The command's CmdSN (None for immediate requests, which take none).
    pub(crate) cmd_sn: Option<u32>,
    pub(crate) reply: oneshot::Sender<Result<ScsiOutcome, Error>>,
}

/// Data-In of one command. A read answered by one Data-In PDU at offset 0 (the common case up
/// to MaxRecvDataSegmentLength) keeps the received segment as is: no allocation, no copy.
#[derive(Debug, Default)]
pub(crate) enum ReadBuffer {
    #[default]
    Empty,
    Whole(Bytes),
    Assembled(BytesMut),
}

impl ReadBuffer {
    /// Places `data` at `offset`; the caller has checked the end against the expected length.
    fn add(&mut self, offset: usize, data: Bytes, expected: usize) {
        if matches!(self, ReadBuffer::Empty) && offset == 0 {
            *self = ReadBuffer::Whole(data);
            return;
        }
        let mut buf = match std::mem::take(self) {
            ReadBuffer::Empty => BytesMut::with_capacity(expected),
            ReadBuffer::Whole(first) => {
                let mut b = BytesMut::with_capacity(expected);
                b.extend_from_slice(&first);
                b
            }
            ReadBuffer::Assembled(b) => b,
        };
        let end = offset + data.len();
        if offset == buf.len() {
            // In order, as targets send Data-In: appended, with no zero-fill first.
            buf.extend_from_slice(&data);
        } else {
            if buf.len() < end {
                buf.resize(end, 0);
            }
            if let Some(dst) = buf.get_mut(offset..end) {
                dst.copy_from_slice(&data);
            }
        }
        *self = ReadBuffer::Assembled(buf);
    }

    /// The buffer to read Data-In at `offset` into in place, taken out (the caller puts it back
    /// as `Assembled`), when that data comes next in order; `None` leaves `self` as it was.
    fn take_in_order(&mut self, offset: usize, expected: usize) -> Option<BytesMut> {
        match self {
            ReadBuffer::Empty if offset == 0 => Some(BytesMut::with_capacity(expected)),
            ReadBuffer::Whole(first) if first.len() == offset => {
                let mut b = BytesMut::with_capacity(expected);
                b.extend_from_slice(first);
                *self = ReadBuffer::Empty;
                Some(b)
            }
            ReadBuffer::Assembled(b) if b.len() == offset => {
                let b = std::mem::take(b);
                *self = ReadBuffer::Empty;
                Some(b)
            }
            _ => None,
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            ReadBuffer::Empty => Bytes::new(),
            ReadBuffer::Whole(b) => b,
            ReadBuffer::Assembled(b) => b.freeze(),
        }
    }
}

/// The session's command window, shared by all its connections (RFC 7143 3.2.2.1: CmdSN,
/// ExpCmdSN and MaxCmdSN are per session; ITTs are unique within the session).
pub(crate) struct Counters {
    pub(crate) cmd_sn: u32,
    pub(crate) exp_cmd_sn: u32,
    pub(crate) max_cmd_sn: u32,
    pub(crate) next_itt: u32,
}

pub(crate) struct Window {
    pub(crate) counters: Mutex<Counters>,
    /// Signalled when MaxCmdSN grows (or a connection ends).
    pub(crate) opened: Notify,
}

impl Window {
    pub(crate) fn new(cmd_sn: u32, max_cmd_sn: u32) -> Window {
        Window {
            counters: Mutex::new(Counters {
                cmd_sn,
                exp_cmd_sn: cmd_sn,
                max_cmd_sn,
                next_itt: 1,
            }),
            opened: Notify::new(),
        }
    }

    /// Lock order: the window before any connection's state.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One connection's own state.
pub(crate) struct State {
    pub(crate) exp_stat_sn: u32,
    pub(crate) pending: HashMap<u32, Pending>,
    /// None once the connection is gone.
    pub(crate) tx: Option<mpsc::UnboundedSender<Pdu>>,
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// A second descriptor of the socket, so `Session::kill` can make its close abortive.
    pub(crate) socket: Mutex<Option<OwnedFd>>,
    /// CmdSNs of the commands lost when the connection ended (see `end`).
    pub(crate) lost: Mutex<Vec<u32>>,
    pub(crate) window: Arc<Window>,
    pub(crate) addr: SocketAddr,
    pub(crate) max_send: usize,
    pub(crate) first_burst: usize,
    pub(crate) immediate_data: bool,
    pub(crate) initial_r2t: bool,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic elsewhere; the counters are still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Queues Data-Out PDUs for `data[from..to]`, cut at `max_send`, DataSN from 0.
pub(crate) fn data_out(
    pdus: &mut Vec<Pdu>,
    data: &Bytes,
    from: usize,
    to: usize,
    max_send: usize,
    (lun, itt, ttt, exp_stat_sn): (u64, u32, u32, u32),
) {
    let mut off = from;
    let mut data_sn = 0u32;
    while off < to {
        let n = (to - off).min(max_send.max(1));
        pdus.push(Pdu::DataOut(DataOut {
            final_bit: off + n == to,
            lun,
            itt,
            ttt,
            exp_stat_sn,
            data_sn,
            buffer_offset: off as u32,
            data: data.slice(off..off + n),
        }));
        data_sn = data_sn.wrapping_add(1);
        off += n;
    }
}

/// PDUs encoded per vectored write at most (each is up to three chunks).
const WRITE_BATCH: usize = MAX_SLICES / 3;

pub(crate) async fn write_loop(mut wr: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Pdu>) {
    let framer = Framer::default();
    let mut scratch = BytesMut::with_capacity(4096);
    let mut trailers = BytesMut::new();
    let mut chunks: Vec<Bytes> = Vec::with_capacity(MAX_SLICES);
    while let Some(pdu) = rx.recv().await {
        // Everything queued now (up to a batch) goes out with one vectored write: headers and
        // data segments as they are, nothing copied into a buffer first.
        let mut next = Some(pdu);
        let mut count = 0;
        while let Some(pdu) = next {
            framer
                .encode(&pdu, &mut scratch)
                .push_chunks(&mut chunks, &mut trailers);
            count += 1;
            next = if count < WRITE_BATCH {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        let mut cursor = ChunkCursor::default();
        while !cursor.done(&chunks) {
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            let n = cursor.slices(&chunks, &mut slices);
            match wr.write_vectored(slices.get(..n).unwrap_or_default()).await {
                Ok(0) | Err(_) => return,
                Ok(written) => cursor.advance(&chunks, written),
            }
        }
        chunks.clear();
    }
}

pub(crate) async fn read_loop(
    mut rd: OwnedReadHalf,
    mut buf: BytesMut,
    framer: Framer,
    shared: Arc<Shared>,
) {
    let reason = loop {
        match framer.decode(&mut buf) {
            Ok(Some(pdu)) => {
                if let Err(e) = handle(&shared, pdu) {
                    break e;
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => break Error::Protocol(format!("undecodable PDU: {e}")),
        }
        match framer.split_data_in_head(&mut buf, DIRECT_MIN) {
            Ok(Some(head)) => {
                if let Err(e) = read_data_in_direct(&mut rd, &mut buf, &framer, &shared, head).await
                {
                    break e;
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => break Error::Protocol(format!("undecodable PDU: {e}")),
        }
        // While a READ longer than one Data-In segment is under way, read no further than the
        // PDU at hand: the next header then arrives on its own and its segment is read straight
        // into the command's buffer, instead of into `buf` first and copied from there.
        let needed = framer.bytes_needed(&buf);
        let limit = if shared.multi_pdu_read_pending(framer.max_recv_data_segment_length) {
            needed
        } else {
            usize::MAX
        };
        buf.reserve(needed.max(READ_CHUNK));
        match rd.read_buf(&mut (&mut buf).limit(limit)).await {
            Ok(0) => break Error::ConnectionLost,
            Ok(_) => {}
            Err(_) => break Error::ConnectionLost,
        }
    };
    tracing::debug!(portal = %shared.addr, "session ends: {reason}");
    shared.end();
}

/// Reads the data segment of the Data-In whose header `head` is into its command's buffer (or,
/// when it does not come next in order there, into a buffer of its own), checks its trailer,
/// and handles the PDU as `handle` does.
async fn read_data_in_direct(
    rd: &mut OwnedReadHalf,
    buf: &mut BytesMut,
    framer: &Framer,
    shared: &Shared,
    head: DataInHead,
) -> Result<(), Error> {
    let d = &head.pdu;
    let off = d.buffer_offset as usize;
    let in_place = {
        let mut st = shared.lock();
        let Some(p) = st.pending.get_mut(&d.itt) else {
            return Err(Error::Protocol(format!(
                "Data-In for unknown ITT {:#x}",
                d.itt
            )));
        };
        if off.saturating_add(head.segment) > p.expected {
            return Err(Error::Protocol("Data-In beyond the expected length".into()));
        }
        p.read.take_in_order(off, p.expected)
    };
    let placed = in_place.is_some();
    let mut dst = in_place.unwrap_or_else(|| BytesMut::with_capacity(head.segment));
    let start = dst.len();
    let have = buf.len().min(head.segment);
    dst.extend_from_slice(&buf.split_to(have));
    let mut left = head.segment - have;
    dst.reserve(left);
    while left > 0 {
        match rd.read_buf(&mut (&mut dst).limit(left)).await {
            Ok(0) | Err(_) => return Err(Error::ConnectionLost),
            Ok(n) => left -= n,
        }
    }
    loop {
        match framer.finish_data_in(&head, dst.get(start..).unwrap_or_default(), buf) {
            Ok(true) => break,
            Ok(false) => {
                buf.reserve(READ_CHUNK);
                match rd.read_buf(buf).await {
                    Ok(0) | Err(_) => return Err(Error::ConnectionLost),
                    Ok(_) => {}
                }
            }
            Err(e) => return Err(Error::Protocol(format!("undecodable PDU: {e}"))),
        }
    }
    let mut pdu = head.pdu;
    if placed {
        // Back where `handle` finds it; the PDU itself then carries no data.
        if let Some(p) = shared.lock().pending.get_mut(&pdu.itt) {
            p.read = ReadBuffer::Assembled(dst);
        }
    } else {
        pdu.data = dst.freeze();
    }
    handle(shared, Pdu::DataIn(pdu))
}

impl Shared {
    /// Whether a command waits for more data-in than one Data-In PDU can carry.
    fn multi_pdu_read_pending(&self, max_segment: usize) -> bool {
        self.lock()
            .pending
            .values()
            .any(|p| p.expected > max_segment)
    }

    /// The connection is gone: every outstanding command ends with `ConnectionLost` and no new
    /// one is queued. The CmdSNs those commands had taken are kept for `take_lost`, however the
    /// connection ended (killed, or lost on its own).
    pub(crate) fn end(&self) {
        let pending: Vec<Pending> = {
            let mut st = self.lock();
            st.tx = None;
            st.pending.drain().map(|(_, p)| p).collect()
        };
        let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        for p in pending {
            lost.extend(p.cmd_sn);
            let _ = p.reply.send(Err(Error::ConnectionLost));
        }
        drop(lost);
        self.window.opened.notify_waiters();
    }

    /// The CmdSNs of the commands the ended connection lost (each returned once).
    pub(crate) fn take_lost(&self) -> Vec<u32> {
        std::mem::take(&mut *self.lost.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// One PDU from the target. An error ends the connection.
fn handle(shared: &Shared, pdu: Pdu) -> Result<(), Error> {
    let (stat_sn, exp_cmd_sn, max_cmd_sn, advances) = match &pdu {
        Pdu::ScsiResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
        Pdu::DataIn(d) => (d.stat_sn, d.exp_cmd_sn, d.max_cmd_sn, d.status_present),
        Pdu::NopIn(n) => (n.stat_sn, n.exp_cmd_sn, n.max_cmd_sn, n.itt != RESERVED_TAG),
        Pdu::TaskMgmtResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
        Pdu::TextResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
        Pdu::LogoutResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
        Pdu::Reject(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
        Pdu::R2t(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, false),
        Pdu::AsyncMessage(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
        other => {
            return Err(Error::Protocol(format!(
                "unexpected {:?} in full feature phase",
                other.opcode()
            )))
        }
    };
    // The session's window first (lock order), then this connection's state.
    let next_cmd_sn = {
        let mut w = shared.window.lock();
        if serial::gt(exp_cmd_sn, w.exp_cmd_sn) && serial::le(exp_cmd_sn, w.cmd_sn) {
            w.exp_cmd_sn = exp_cmd_sn;
        }
        if serial::gt(max_cmd_sn, w.max_cmd_sn) {
            w.max_cmd_sn = max_cmd_sn;
            shared.window.opened.notify_waiters();
        }
        w.cmd_sn
    };
    let mut st = shared.lock();
    if advances && serial::le(st.exp_stat_sn, stat_sn) {
        st.exp_stat_sn = stat_sn.wrapping_add(1);
    }
    match pdu {
        Pdu::DataIn(d) => {
            let Some(p) = st.pending.get_mut(&d.itt) else {
                return Err(Error::Protocol(format!(
                    "Data-In for unknown ITT {:#x}",
                    d.itt
                )));
            };
            let off = d.buffer_offset as usize;
            let end = off.saturating_add(d.data.len());
            if end > p.expected {
                return Err(Error::Protocol("Data-In beyond the expected length".into()));
            }
            if !d.data.is_empty() {
                p.read.add(off, d.data, p.expected);
            }
            if d.status_present {
                if let Some(p) = st.pending.remove(&d.itt) {
                    let _ = p.reply.send(Ok(ScsiOutcome {
                        status: d.status,
                        response: 0,
                        sense: Bytes::new(),
                        data: p.read.into_bytes(),
                        residual: d.residual,
                    }));
                }
            }
        }
        Pdu::ScsiResponse(r) => {
            if let Some(p) = st.pending.remove(&r.itt) {
                // Sense data: 2-byte length, then the sense bytes (RFC 7143 11.4.7).
                let sense = match (r.data.first(), r.data.get(1)) {
                    (Some(&hi), Some(&lo)) => {
                        let n = usize::from(u16::from_be_bytes([hi, lo]));
                        r.data.slice(2..(2 + n).min(r.data.len()))
                    }
                    _ => Bytes::new(),
                };
                let _ = p.reply.send(Ok(ScsiOutcome {
                    status: r.status,
                    response: r.response,
                    sense,
                    data: p.read.into_bytes(),
                    residual: r.residual,
                }));
            }
        }
        Pdu::R2t(r) => {
            let Some(p) = st.pending.get(&r.itt) else {
                return Err(Error::Protocol(format!("R2T for unknown ITT {:#x}", r.itt)));
            };
            let off = r.buffer_offset as usize;
            let end = off.saturating_add(r.desired_length as usize);
            if end > p.write.len() || r.desired_length == 0 {
                return Err(Error::Protocol("R2T beyond the write's data".into()));
            }
            let mut pdus = Vec::new();
            let exp_stat_sn = st.exp_stat_sn;
            data_out(
                &mut pdus,
                &p.write,
                off,
                end,
                shared.max_send,
                (r.lun, r.itt, r.ttt, exp_stat_sn),
            );
            if let Some(q) = &st.tx {
                for pdu in pdus {
                    let _ = q.send(pdu);
                }
            }
        }
        Pdu::NopIn(n) if n.itt == RESERVED_TAG && n.ttt != RESERVED_TAG => {
            {
                // A ping from the target: answer with its TTT (RFC 7143 11.18).
                let reply = Pdu::NopOut(NopOut {
                    immediate: true,
                    lun: n.lun,
                    itt: RESERVED_TAG,
                    ttt: n.ttt,
                    cmd_sn: next_cmd_sn,
                    exp_stat_sn: st.exp_stat_sn,
                    data: Bytes::new(),
                });
                if let Some(q) = &st.tx {
                    let _ = q.send(reply);
                }
            }
        }
        Pdu::NopIn(n) if n.itt != RESERVED_TAG => {
            // The answer to one of our pings.
            if let Some(p) = st.pending.remove(&n.itt) {
                let _ = p.reply.send(Ok(ScsiOutcome::default()));
            }
        }
        Pdu::TaskMgmtResponse(r) => {
            if let Some(p) = st.pending.remove(&r.itt) {
                let _ = p.reply.send(Ok(ScsiOutcome {
                    response: r.response,
                    ..ScsiOutcome::default()
                }));
            }
        }
        Pdu::TextResponse(r) => {
            if let Some(p) = st.pending.remove(&r.itt) {
                let result = if r.final_bit {
                    Ok(ScsiOutcome {
                        data: r.data,
                        ..ScsiOutcome::default()
                    })
                } else {
                    Err(Error::Protocol(
                        "continued text responses are not supported".into(),
                    ))
                };
                let _ = p.reply.send(result);
            }
        }
        Pdu::LogoutResponse(r) => {
            if let Some(p) = st.pending.remove(&r.itt) {
                let _ = p.reply.send(Ok(ScsiOutcome {
                    response: r.response,
                    ..ScsiOutcome::default()
                }));
            }
        }
        Pdu::Reject(r) => {
            // The rejected PDU's header is the data; its ITT is at bytes 16..20.
            let itt = r
                .data
                .get(16..20)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map(u32::from_be_bytes);
            if let Some(p) = itt.and_then(|itt| st.pending.remove(&itt)) {
                let _ = p.reply.send(Err(Error::Protocol(format!(
                    "target rejected the request (reason {:#04x})",
                    r.reason
                ))));
            }
        }
        Pdu::AsyncMessage(m) => {
            tracing::debug!(event = m.event, "asynchronous message from the target");
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ReadBuffer;
    use bytes::Bytes;

    fn piece(i: u8, len: usize) -> Bytes {
        Bytes::from((0..len).map(|j| i ^ j as u8).collect::<Vec<u8>>())
    }

    /// Data-In in order, out of order, or in one PDU: the same bytes in the same places.
    #[test]
    fn pieces_land_at_their_offsets_in_any_order() {
        let len = 4 * 1000;
        let whole: Vec<u8> = (0..4u8).flat_map(|i| piece(i, 1000).to_vec()).collect();
        for order in [[0, 1, 2, 3], [1, 0, 3, 2], [3, 2, 1, 0], [0, 2, 1, 3]] {
            let mut buf = ReadBuffer::default();
            for i in order {
                buf.add(usize::from(i) * 1000, piece(i, 1000), len);
            }
            assert_eq!(buf.into_bytes(), whole, "order {order:?}");
        }
        let mut one = ReadBuffer::default();
        one.add(0, Bytes::from(whole.clone()), len);
        assert!(matches!(one, ReadBuffer::Whole(_)));
        assert_eq!(one.into_bytes(), whole);
    }
}
