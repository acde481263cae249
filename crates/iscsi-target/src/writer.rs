//! The sending half of a connection: numbers responses with StatSN, lays out Data-In sequences
//! and writes every queued PDU of a wake-up in one vectored write.

use crate::data_in::Grid;
pub use crate::data_in::{DataInPart, ScsiDone};
use crate::pool::BufferPool;
use crate::send_queue::{weight, Backlog};
use crate::session::Session;
use crate::stats::ConnectionStats;
use bytes::{Bytes, BytesMut};
use iscsi_proto::pdu::{Framer, Pdu, RESERVED_TAG};
use iscsi_proto::vectored::{ChunkCursor, MAX_SLICES};
use std::io::IoSlice;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

/// Most PDUs gathered into one vectored write.
const BATCH_PDUS: usize = 64;

/// What the connection's other tasks ask the writer to send.
pub enum Outbound {
    /// A PDU; StatSN, ExpCmdSN and MaxCmdSN are filled in here.
    Pdu(Pdu),
    Scsi(ScsiDone),
    /// Data-In of a READ still being read, sent ahead of its `Scsi` (which carries the rest
    /// and the status). `offset` and the end of `data` are Data-In PDU boundaries: multiples
    /// of [`read_piece`].
    DataInPart(DataInPart),
    /// Flush what is queued, then close the socket (after a Logout Response or a fatal error).
    Close,
}

/// Does sending this PDU advance StatSN (RFC 7143 3.2.2.2, 11.19.4)?
fn advances_stat_sn(pdu: &Pdu) -> bool {
    match pdu {
        Pdu::NopIn(p) => p.itt != RESERVED_TAG,
        Pdu::R2t(_) | Pdu::AsyncMessage(_) => false,
        Pdu::DataIn(p) => p.status_present,
        _ => true,
    }
}

/// Fills the sequence-number fields the writer owns.
fn stamp(pdu: &mut Pdu, stat_sn: u32, exp: u32, max: u32) {
    match pdu {
        Pdu::NopIn(p) => (p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn) = (stat_sn, exp, max),
        Pdu::ScsiResponse(p) => (p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn) = (stat_sn, exp, max),
        Pdu::TaskMgmtResponse(p) => (p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn) = (stat_sn, exp, max),
        Pdu::TextResponse(p) => (p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn) = (stat_sn, exp, max),
        Pdu::DataIn(p) => (p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn) = (stat_sn, exp, max),
        Pdu::LogoutResponse(p) => (p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn) = (stat_sn, exp, max),
        Pdu::R2t(p) => (p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn) = (stat_sn, exp, max),
        Pdu::AsyncMessage(p) => (p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn) = (stat_sn, exp, max),
        Pdu::Reject(p) => (p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn) = (stat_sn, exp, max),
        _ => {}
    }
}

/// Messages taken from the queue for one write.
#[derive(Default)]
struct Batch {
    count: usize,
    /// Their weight in the send backlog.
    taken: usize,
    close: bool,
}

/// Sends queued PDUs until the channel closes or `Close` arrives.
pub struct Writer {
    pub socket: OwnedWriteHalf,
    pub session: Arc<Session>,
    pub stats: Arc<ConnectionStats>,
    pub framer: Framer,
    /// StatSN the next status-bearing PDU gets.
    pub stat_sn: u32,
    /// The initiator's MaxRecvDataSegmentLength: Data-In segments are cut to it.
    pub max_xmit: u32,
    /// MaxBurstLength: the F bit closes each Data-In sequence of this size.
    pub max_burst: u32,
    /// Where Data-In buffers go back once written.
    pub pool: Arc<BufferPool>,
    /// Data-In buffers of the PDUs being written, returned to `pool` after the write.
    pub sent: Vec<Bytes>,
    /// Bytes queued for this writer (`limits.send-backlog`), released once written.
    pub backlog: Arc<Backlog>,
}

impl Writer {
    fn grid(&self) -> Grid {
        Grid::new(self.max_xmit, self.max_burst)
    }

    pub async fn run(self, rx: mpsc::UnboundedReceiver<Outbound>) -> std::io::Result<()> {
        let backlog = self.backlog.clone();
        let result = self.send_all(rx).await;
        backlog.close();
        result
    }

    async fn send_all(mut self, mut rx: mpsc::UnboundedReceiver<Outbound>) -> std::io::Result<()> {
        let mut scratch = BytesMut::with_capacity(64 * 1024);
        let mut trailers = BytesMut::with_capacity(BATCH_PDUS * 8);
        let mut chunks: Vec<Bytes> = Vec::with_capacity(BATCH_PDUS * 3);
        let mut pdus: Vec<Pdu> = Vec::with_capacity(BATCH_PDUS);
        while let Some(first) = rx.recv().await {
            let mut batch = Batch::default();
            self.gather(Some(first), &mut rx, &mut batch, &mut pdus);
            // More commands of this session are still running: their completions often
            // arrive a moment apart (one pass of a replicated LUN's core ends several). Let
            // them queue for one scheduler turn, so they share this write and the host's
            // wake-up. Never at queue depth 1: nothing else is in flight then.
            if !batch.close
                && batch.count < BATCH_PDUS
                && self.session.tasks_in_flight() > batch.count
            {
                tokio::task::yield_now().await;
                let next = rx.try_recv().ok();
                self.gather(next, &mut rx, &mut batch, &mut pdus);
            }
            let (taken, close) = (batch.taken, batch.close);
            self.flush(&mut pdus, &mut chunks, &mut scratch, &mut trailers)
                .await?;
            self.backlog.release(taken);
            if close {
                let _ = self.socket.shutdown().await;
                return Ok(());
            }
        }
        Ok(())
    }

    /// Lays out `next` and what else is queued into `pdus`, until [`BATCH_PDUS`] messages or
    /// `Close`.
    fn gather(
        &mut self,
        mut next: Option<Outbound>,
        rx: &mut mpsc::UnboundedReceiver<Outbound>,
        batch: &mut Batch,
        pdus: &mut Vec<Pdu>,
    ) {
        while let Some(msg) = next.take() {
            batch.taken += weight(&msg);
            match msg {
                Outbound::Pdu(p) => pdus.push(p),
                Outbound::Scsi(done) => self.grid().lay_out(done, pdus, &mut self.sent),
                Outbound::DataInPart(part) => self.grid().lay_out_part(part, pdus, &mut self.sent),
                Outbound::Close => {
                    batch.close = true;
                    return;
                }
            }
            batch.count += 1;
            if batch.count >= BATCH_PDUS {
                return;
            }
            next = rx.try_recv().ok();
        }
    }

    async fn flush(
        &mut self,
        pdus: &mut Vec<Pdu>,
        chunks: &mut Vec<Bytes>,
        scratch: &mut BytesMut,
        trailers: &mut BytesMut,
    ) -> std::io::Result<()> {
        if pdus.is_empty() {
            return Ok(());
        }
        let exp = self.session.exp_cmd_sn();
        let max = self.session.max_cmd_sn();
        let count = pdus.len();
        for mut pdu in pdus.drain(..) {
            stamp(&mut pdu, self.stat_sn, exp, max);
            if advances_stat_sn(&pdu) {
                self.stat_sn = self.stat_sn.wrapping_add(1);
            }
            self.framer
                .encode(&pdu, scratch)
                .push_chunks(chunks, trailers);
        }
        let total: usize = chunks.iter().map(Bytes::len).sum();
        write_all_vectored(&mut self.socket, chunks).await?;
        chunks.clear();
        for data in self.sent.drain(..) {
            self.pool.put(data);
        }
        self.stats.add_out(count, total);
        Ok(())
    }
}

/// Writes every chunk, resuming after partial writes.
async fn write_all_vectored(socket: &mut OwnedWriteHalf, chunks: &[Bytes]) -> std::io::Result<()> {
    let mut cursor = ChunkCursor::default();
    while !cursor.done(chunks) {
        let mut slices = [IoSlice::new(&[]); MAX_SLICES];
        let n = cursor.slices(chunks, &mut slices);
        let written = socket
            .write_vectored(slices.get(..n).unwrap_or_default())
            .await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        cursor.advance(chunks, written);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::TaskEntry;
    use iscsi_proto::negotiation::SessionParams;
    use iscsi_proto::pdu::NopIn;
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    /// A writer on a loopback socket for a session with `tasks` commands in flight, and the
    /// socket's other end.
    async fn writer(tasks: u32) -> (Writer, Arc<ConnectionStats>, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (_, socket) = server.into_split();
        let nexus = scsi::Nexus {
            id: 1,
            initiator_name: Arc::from("iqn.2026-11.io.lanes:test"),
            isid: [0; 6],
            relative_target_port: 1,
            target_port_group: 1,
        };
        let session = Arc::new(Session::new(
            1,
            [0; 6],
            Arc::from("iqn.2026-11.io.lanes:test"),
            SessionParams::default(),
            None,
            nexus,
            1,
            0,
            64,
        ));
        for itt in 0..tasks {
            let entry = TaskEntry {
                lun: 0,
                cid: 0,
                aborted: false,
                tas: false,
                executing: true,
                ordered: false,
            };
            session.task_started(itt, entry);
        }
        let stats = Arc::new(ConnectionStats::default());
        let writer = Writer {
            socket,
            session,
            stats: stats.clone(),
            framer: Framer::default(),
            stat_sn: 1,
            max_xmit: 8192,
            max_burst: 262_144,
            pool: Arc::new(BufferPool::default()),
            sent: Vec::new(),
            backlog: Backlog::new(1 << 20),
        };
        (writer, stats, client)
    }

    fn nop(itt: u32) -> Outbound {
        Outbound::Pdu(Pdu::NopIn(NopIn {
            itt,
            ttt: RESERVED_TAG,
            ..NopIn::default()
        }))
    }

    /// Sends `first`, lets the writer run once, sends `second`, and returns how many socket
    /// writes carried the two PDUs.
    async fn two_pdus_a_moment_apart(tasks: u32) -> u64 {
        let (writer, stats, mut client) = writer(tasks).await;
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(writer.run(rx));
        tx.send(nop(1)).unwrap();
        // One turn of this single-threaded runtime: the writer takes the first PDU.
        tokio::task::yield_now().await;
        tx.send(nop(2)).unwrap();
        let mut both = [0u8; 2 * 48];
        client.read_exact(&mut both).await.unwrap();
        drop(tx);
        task.await.unwrap().unwrap();
        assert_eq!(stats.pdus_out.load(Ordering::Relaxed), 2);
        stats.writes_out.load(Ordering::Relaxed)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn responses_ending_a_moment_apart_share_one_write_while_others_run() {
        assert_eq!(two_pdus_a_moment_apart(4).await, 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn with_nothing_else_in_flight_a_response_goes_out_at_once() {
        assert_eq!(two_pdus_a_moment_apart(1).await, 2);
    }
}
