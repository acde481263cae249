//! The queue from a connection's tasks to its writer, with the bytes in it counted: while a
//! peer does not read its responses, the connection stops reading its requests once
//! `limits.send-backlog` bytes wait, so a peer cannot make the target queue responses without
//! bound (the CmdSN window reopens as responses are queued, not as they are read).
//!
//! One atomic add per queued response and one subtraction per written batch; no lock.

use crate::writer::Outbound;
use iscsi_proto::pdu::BHS_LEN;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, Notify};

/// Bytes queued for the writer, and the reader's wake-up once they fall below the limit.
pub struct Backlog {
    bytes: AtomicUsize,
    limit: usize,
    drained: Notify,
    /// The writer is gone: nothing will drain, so the reader must not wait for it.
    closed: AtomicBool,
}

impl Backlog {
    pub fn new(limit: usize) -> Arc<Backlog> {
        Arc::new(Backlog {
            bytes: AtomicUsize::new(0),
            limit,
            drained: Notify::new(),
            closed: AtomicBool::new(false),
        })
    }

    /// Bytes queued and not yet written.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    /// True while the reader should leave the socket alone.
    pub fn is_full(&self) -> bool {
        self.bytes() >= self.limit && !self.closed.load(Ordering::Acquire)
    }

    /// The writer has ended (socket closed or failed).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.drained.notify_one();
    }

    /// Resolves once the backlog has fallen below the limit after being full (a permit is kept
    /// when nobody waits, so a release between `is_full` and this call is not lost).
    pub async fn drained(&self) {
        self.drained.notified().await;
    }

    /// The writer has written `bytes` of what was queued.
    pub fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let before = self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        if before >= self.limit && before.saturating_sub(bytes) < self.limit {
            self.drained.notify_one();
        }
    }
}

/// What a queued message holds in memory, roughly: its header and data.
pub fn weight(msg: &Outbound) -> usize {
    match msg {
        Outbound::Pdu(p) => BHS_LEN + p.data().len(),
        Outbound::Scsi(done) => {
            BHS_LEN + done.data_in.len() + done.sense.as_ref().map_or(0, |s| s.len())
        }
        Outbound::DataInPart(p) => BHS_LEN + p.data.len(),
        Outbound::Close => 0,
    }
}

/// The sending end: `mpsc::UnboundedSender` with the backlog counted.
#[derive(Clone)]
pub struct OutSender {
    tx: mpsc::UnboundedSender<Outbound>,
    backlog: Arc<Backlog>,
}

impl OutSender {
    pub fn new(tx: mpsc::UnboundedSender<Outbound>, backlog: Arc<Backlog>) -> Self {
        OutSender { tx, backlog }
    }

    pub fn send(&self, msg: Outbound) -> Result<(), mpsc::error::SendError<Outbound>> {
        let w = weight(&msg);
        self.backlog.bytes.fetch_add(w, Ordering::AcqRel);
        self.tx.send(msg).inspect_err(|_| self.backlog.release(w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_proto::pdu::{NopIn, Pdu};

    fn nop(len: usize) -> Outbound {
        Outbound::Pdu(Pdu::NopIn(NopIn {
            data: vec![0u8; len].into(),
            ..NopIn::default()
        }))
    }

    #[tokio::test]
    async fn full_until_released_below_the_limit() {
        let backlog = Backlog::new(1000);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let out = OutSender::new(tx, backlog.clone());
        out.send(nop(600)).unwrap();
        assert!(!backlog.is_full());
        out.send(nop(600)).unwrap();
        assert!(backlog.is_full());
        let first = rx.recv().await.unwrap();
        backlog.release(weight(&first));
        assert!(!backlog.is_full());
        // The permit left by the release wakes a reader that checks only now.
        tokio::time::timeout(std::time::Duration::from_secs(5), backlog.drained())
            .await
            .expect("drained");
        assert_eq!(backlog.bytes(), BHS_LEN + 600);
    }
}
