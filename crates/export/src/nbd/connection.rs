//! One NBD client connection: the handshake, then pipelined transmission. The connection's
//! task reads and checks requests and spawns one task per request; replies go through a
//! bounded channel to a writer task that sends each batch with one vectored write. A
//! semaphore bounds the requests in flight and the payload bytes they hold.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::handshake::{ExportInfo, Handshake, HandshakeError, Progress};
use super::proto::{ErrorCode, ProtoError, Request, SimpleReply};
use super::transmission::{check, Action, Limits, Verdict};
use crate::aligned::{AlignedIo, Zeroing};
use crate::Device;

/// Bytes asked of each socket read.
const READ_CHUNK: usize = 256 * 1024;
/// Replies written per vectored write at most (two slices each).
const REPLY_BATCH: usize = 64;
/// Budget unit for payload bytes in flight.
const BUDGET_UNIT: u32 = 64 * 1024;
/// A client gets this long to reach transmission, so idle sockets do not hold a slot forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long shutdown waits for a client that does not read its replies.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What every connection of one export shares.
#[derive(Debug)]
pub(crate) struct Shared<D> {
    pub(crate) io: Arc<AlignedIo<D>>,
    pub(crate) export: ExportInfo,
    pub(crate) limits: Limits,
    pub(crate) max_in_flight: usize,
    /// Payload bytes in flight per connection, in [`BUDGET_UNIT`]s.
    pub(crate) budget_units: u32,
}

/// Why a connection ended other than by the client's wish.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectionError {
    #[error("{0}")]
    Handshake(#[from] HandshakeError),
    #[error("protocol violation: {0}")]
    Protocol(ProtoError),
    #[error("write payload of {0} bytes is too large")]
    PayloadTooLarge(u32),
    #[error("no transmission after {HANDSHAKE_TIMEOUT:?} of option haggling")]
    HandshakeTimeout,
    #[error("client did not read its replies at shutdown")]
    StuckAtShutdown,
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// A reply on its way to the socket, with the budget it holds until it is written.
struct Outgoing {
    header: [u8; SimpleReply::LEN],
    data: Bytes,
    _budget: Option<Budget>,
}

/// A request's share of the connection's limits: one of the request slots and its payload
/// units; both return when the reply has been written.
struct Budget {
    _request: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
}

/// Runs one connection to its end. `shutdown` stops the reading of new requests; requests in
/// flight are finished and answered before the connection closes, unless the client stops
/// reading its replies for longer than [`SHUTDOWN_GRACE`]. Request tasks run on `tasks`, so
/// the server can wait for every device call to end.
pub(crate) async fn run<R, W, D>(
    mut reader: R,
    mut writer: W,
    shared: Arc<Shared<D>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) -> Result<(), ConnectionError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
    D: Device,
{
    let mut input = BytesMut::with_capacity(READ_CHUNK);
    let handshake = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        handshake(&mut reader, &mut writer, &mut input, &shared.export),
    );
    let entered = tokio::select! {
        _ = shutdown.cancelled() => return Ok(()),
        entered = handshake => entered.map_err(|_| ConnectionError::HandshakeTimeout)??,
    };
    if !entered {
        return Ok(());
    }

    let (replies, outgoing) = mpsc::channel(shared.max_in_flight.max(1));
    let mut write_task = tokio::spawn(write_replies(writer, outgoing));
    let result = read_requests(&mut reader, input, &shared, &replies, &shutdown, &tasks).await;
    // The writer ends once this and every request task have dropped their senders, that is
    // once every request in flight has been answered.
    drop(replies);
    let stuck = async {
        shutdown.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let written = tokio::select! {
        written = &mut write_task => written,
        _ = stuck => {
            // The client does not read its replies: drop them (request tasks then finish
            // with nowhere to send) and close.
            write_task.abort();
            return Err(ConnectionError::StuckAtShutdown);
        }
    };
    let written = written.map_err(|e| io::Error::other(format!("reply writer failed: {e}")))?;
    result?;
    written?;
    Ok(())
}

/// Option haggling. True: transmission begins; false: the client left or aborted.
async fn handshake<R, W>(
    reader: &mut R,
    writer: &mut W,
    input: &mut BytesMut,
    export: &ExportInfo,
) -> Result<bool, ConnectionError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut handshake = Handshake::new(export.clone());
    loop {
        let progress = handshake.handle(input)?;
        writer.write_all(&handshake.take_output()).await?;
        match progress {
            Progress::NeedInput => {
                if reader.read_buf(input).await? == 0 {
                    return Ok(false);
                }
            }
            Progress::Aborted => {
                writer.shutdown().await.ok();
                return Ok(false);
            }
            Progress::Transmission(negotiated) => {
                tracing::debug!(?negotiated, "NBD client entered transmission");
                writer.flush().await?;
                return Ok(true);
            }
        }
    }
}

/// Reads, checks and dispatches requests until the client disconnects, shutdown, or a
/// protocol violation.
async fn read_requests<R, D>(
    reader: &mut R,
    mut input: BytesMut,
    shared: &Arc<Shared<D>>,
    replies: &mpsc::Sender<Outgoing>,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) -> Result<(), ConnectionError>
where
    R: AsyncRead + Unpin,
    D: Device,
{
    let requests = Arc::new(Semaphore::new(shared.max_in_flight));
    let budget = Arc::new(Semaphore::new(shared.budget_units as usize));
    loop {
        let mut peek: &[u8] = &input;
        let request = match Request::decode(&mut peek) {
            Ok(request) => {
                let _ = input.split_to(Request::LEN);
                request
            }
            Err(ProtoError::Incomplete { .. }) => {
                if !fill(reader, &mut input, Request::LEN, replies, shutdown).await? {
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(ConnectionError::Protocol(e)),
        };
        let payload_len = request.payload_len() as usize;
        let verdict = match check(&request, &shared.limits) {
            Verdict::HardDisconnect => {
                return Err(ConnectionError::PayloadTooLarge(request.length))
            }
            verdict => verdict,
        };
        // Budget first, then the payload: a connection never buffers more than its budget.
        // Only read data and write payloads are held in memory.
        let held = match verdict {
            Verdict::Run(Action::Read { length, .. }) => length,
            _ => request.payload_len(),
        };
        let units = held.div_ceil(BUDGET_UNIT).clamp(1, shared.budget_units);
        let permit = tokio::select! {
            _ = replies.closed() => return Ok(()),
            _ = shutdown.cancelled() => return Ok(()),
            permit = acquire(&requests, &budget, units) => permit,
        };
        if payload_len > 0 && !fill(reader, &mut input, payload_len, replies, shutdown).await? {
            return Ok(());
        }
        let payload = input.split_to(payload_len).freeze();
        match verdict {
            Verdict::Run(Action::Disconnect) => return Ok(()),
            Verdict::Run(action) => {
                let shared = Arc::clone(shared);
                let replies = replies.clone();
                tasks.spawn(async move {
                    let (error, data) = execute(&shared.io, action, payload).await;
                    send(&replies, request.cookie, error, data, permit).await;
                });
            }
            Verdict::Reject(error) => {
                tracing::debug!(?request, ?error, "NBD request rejected");
                send(replies, request.cookie, error, Bytes::new(), permit).await;
            }
            Verdict::HardDisconnect => {
                return Err(ConnectionError::PayloadTooLarge(request.length))
            }
        }
    }
}

/// One request slot and `units` of the payload budget (the semaphores are never closed).
async fn acquire(requests: &Arc<Semaphore>, budget: &Arc<Semaphore>, units: u32) -> Option<Budget> {
    let request = Arc::clone(requests).acquire_owned().await.ok()?;
    let bytes = Arc::clone(budget).acquire_many_owned(units).await.ok()?;
    Some(Budget {
        _request: request,
        _bytes: bytes,
    })
}

/// Reads until `input` holds `want` bytes. False: the client closed, shutdown began, or the
/// reply writer is gone (the socket failed).
async fn fill<R: AsyncRead + Unpin>(
    reader: &mut R,
    input: &mut BytesMut,
    want: usize,
    replies: &mpsc::Sender<Outgoing>,
    shutdown: &CancellationToken,
) -> io::Result<bool> {
    if input.capacity() < want {
        input.reserve(want.max(READ_CHUNK) - input.len());
    }
    while input.len() < want {
        if input.capacity() == input.len() {
            input.reserve(READ_CHUNK);
        }
        let read = tokio::select! {
            _ = shutdown.cancelled() => return Ok(false),
            _ = replies.closed() => return Ok(false),
            read = reader.read_buf(input) => read?,
        };
        if read == 0 {
            if !input.is_empty() {
                tracing::debug!(bytes = input.len(), "NBD client closed mid-request");
            }
            return Ok(false);
        }
    }
    Ok(true)
}

/// Runs a checked request against the device. Device failures are EIO ("Error values").
async fn execute<D: Device>(
    io: &AlignedIo<D>,
    action: Action,
    payload: Bytes,
) -> (ErrorCode, Bytes) {
    let result = match action {
        Action::Read { offset, length } => match io.read(offset, length).await {
            Ok(data) => return (ErrorCode::OK, data),
            Err(e) => Err(e),
        },
        Action::Write { offset, fua, .. } => io.write(offset, payload, fua).await,
        Action::Flush => io.flush().await,
        Action::Trim {
            offset,
            length,
            fua,
        } => match io.trim(offset, u64::from(length)).await {
            Ok(()) if fua => io.flush().await,
            other => other,
        },
        Action::WriteZeroes {
            offset,
            length,
            fua,
        } => {
            io.write_zeroes(offset, u64::from(length), fua, Zeroing::WriteZeroes)
                .await
        }
        Action::Cache | Action::Disconnect => Ok(()),
    };
    match result {
        Ok(()) => (ErrorCode::OK, Bytes::new()),
        Err(e) => {
            tracing::warn!(?action, error = %e, "NBD request failed on the device");
            (ErrorCode::EIO, Bytes::new())
        }
    }
}

async fn send(
    replies: &mpsc::Sender<Outgoing>,
    cookie: u64,
    error: ErrorCode,
    data: Bytes,
    budget: Option<Budget>,
) {
    let header = SimpleReply { error, cookie }.to_bytes();
    // A closed channel means the socket is gone; the reply has nowhere to go.
    let _ = replies
        .send(Outgoing {
            header,
            data,
            _budget: budget,
        })
        .await;
}

/// Writes replies as they come, each batch with one vectored write, until every sender is
/// gone; then closes the write side.
async fn write_replies<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut outgoing: mpsc::Receiver<Outgoing>,
) -> io::Result<()> {
    let mut batch = Vec::with_capacity(REPLY_BATCH);
    while outgoing.recv_many(&mut batch, REPLY_BATCH).await > 0 {
        write_batch(&mut writer, &batch).await?;
        // Dropping the replies releases their budget.
        batch.clear();
    }
    writer.flush().await?;
    writer.shutdown().await
}

/// Writes every header and data slice of `batch`, resuming after short writes.
async fn write_batch<W: AsyncWrite + Unpin>(writer: &mut W, batch: &[Outgoing]) -> io::Result<()> {
    // Position: (reply index, 0 = header / 1 = data, offset within that slice).
    let mut reply = 0usize;
    let mut part = 0usize;
    let mut offset = 0usize;
    let empty = IoSlice::new(&[]);
    let mut slices = [empty; 2 * REPLY_BATCH];
    loop {
        let mut count = 0;
        let (mut r, mut p, mut o) = (reply, part, offset);
        while let (Some(item), Some(slot)) = (batch.get(r), slices.get_mut(count)) {
            let whole: &[u8] = if p == 0 { &item.header } else { &item.data };
            if let Some(rest) = whole.get(o..).filter(|rest| !rest.is_empty()) {
                *slot = IoSlice::new(rest);
                count += 1;
            }
            o = 0;
            p += 1;
            if p == 2 {
                p = 0;
                r += 1;
            }
        }
        if count == 0 {
            return Ok(());
        }
        let mut written = writer
            .write_vectored(slices.get(..count).unwrap_or_default())
            .await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        // Advance the position past what was written.
        while written > 0 {
            let Some(item) = batch.get(reply) else { break };
            let len = if part == 0 {
                item.header.len()
            } else {
                item.data.len()
            };
            let left = len - offset;
            if written >= left {
                written -= left;
                offset = 0;
                part += 1;
                if part == 2 {
                    part = 0;
                    reply += 1;
                }
            } else {
                offset += written;
                written = 0;
            }
        }
    }
}
