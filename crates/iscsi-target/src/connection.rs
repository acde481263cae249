//! One TCP connection: login, then the full-feature phase's receive side (command ordering,
//! Data-Out collection, task management, NOP pings, logout). Sending is `writer::Writer`.

use crate::pool::BufferPool;
use crate::send_queue::{Backlog, OutSender};
use crate::server::{Portal, Server};
use crate::session::{Begin, ConnectionHandle, Delivery, ReleasedCommand, Session, TaskEntry};
use crate::stats::ConnectionStats;
use crate::writer::{Outbound, Writer};

mod login;
mod text;
mod writes;

use bytes::{Bytes, BytesMut};
use iscsi_proto::negotiation::ConnectionParams;
use iscsi_proto::pdu::*;
use iscsi_proto::text_exchange::TextResponder;
use iscsi_proto::window::R2tRequest;
use login::LoggedIn;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use writes::PendingWrite;

/// Why reading stopped.
enum ReadEnd {
    Closed,
    Error(std::io::Error),
    Protocol(PduError),
}

/// Reads until one whole PDU is buffered and decoded.
async fn read_pdu(
    rd: &mut OwnedReadHalf,
    buf: &mut BytesMut,
    framer: &Framer,
) -> Result<Pdu, ReadEnd> {
    loop {
        match framer.decode(buf) {
            Ok(Some(p)) => return Ok(p),
            Ok(None) => {}
            Err(e) => return Err(ReadEnd::Protocol(e)),
        }
        // Small reads while logging in: a connection that never logs in holds little memory.
        buf.reserve(framer.bytes_needed(buf).max(1024));
        match rd.read_buf(buf).await {
            Ok(0) => return Err(ReadEnd::Closed),
            Ok(_) => {}
            Err(e) => return Err(ReadEnd::Error(e)),
        }
    }
}

/// Serves one accepted connection to the end: its login phase here (on the login thread, see
/// `login_thread`), then its full-feature phase on `serving`, the runtime of the sessions.
pub async fn run(
    server: Arc<Server>,
    stream: TcpStream,
    portal: Portal,
    peer: SocketAddr,
    portal_stop: CancellationToken,
    serving: Handle,
) {
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().unwrap_or(portal.addr);
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = BytesMut::new();
    let Some(logged_in) = login::log_in(
        &server,
        &mut rd,
        &mut wr,
        &mut buf,
        (portal, peer, local),
        &portal_stop,
    )
    .await
    else {
        return;
    };
    // The socket leaves the login thread's reactor for the serving runtime's.
    let moved = rd
        .reunite(wr)
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(TcpStream::into_std);
    let std_stream = match moved {
        Ok(s) => s,
        Err(e) => {
            warn!(%peer, portal = %local, "connection lost while leaving the login phase: {e}");
            drop_login(&server, &logged_in.session);
            return;
        }
    };
    let serving_server = server.clone();
    let served = serving.spawn(async move {
        let server = serving_server;
        match TcpStream::from_std(std_stream) {
            Ok(stream) => {
                let (rd, wr) = stream.into_split();
                full_feature(server, rd, wr, buf, logged_in, local, peer, portal_stop).await;
            }
            Err(e) => {
                warn!(%peer, portal = %local, "connection lost while leaving the login phase: {e}");
                drop_login(&server, &logged_in.session);
            }
        }
    });
    // The connection's slot (connection limits) is held until it ends; a serving runtime that
    // shuts down ends it too.
    let _ = served.await;
}

/// A completed login whose connection was lost before its full-feature phase began: a new
/// session it created goes with it.
fn drop_login(server: &Arc<Server>, session: &Arc<Session>) {
    if session.connection_count() == 0 {
        server.remove_session(session);
    }
}

/// The full-feature phase of a connection whose login has completed, to its end.
#[allow(clippy::too_many_arguments)]
async fn full_feature(
    server: Arc<Server>,
    rd: OwnedReadHalf,
    wr: tokio::net::tcp::OwnedWriteHalf,
    buf: BytesMut,
    logged_in: LoggedIn,
    local: SocketAddr,
    peer: SocketAddr,
    portal_stop: CancellationToken,
) {
    let LoggedIn {
        session,
        outcome,
        cid,
        stat_sn,
    } = logged_in;
    let limits = &server.limits;
    info!(
        initiator = %session.initiator_name,
        %peer,
        portal = %local,
        tsih = session.tsih,
        cid,
        kind = if session.target.is_some() { "normal" } else { "discovery" },
        "login"
    );
    let params = outcome.connection;
    let stats = Arc::new(ConnectionStats::default());
    stats
        .header_digest
        .store(params.header_digest, Ordering::Relaxed);
    stats
        .data_digest
        .store(params.data_digest, Ordering::Relaxed);
    let framer = Framer {
        header_digest: params.header_digest,
        data_digest: params.data_digest,
        max_recv_data_segment_length: params.max_recv_data_segment_length as usize,
    };
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let backlog = Backlog::new(limits.config.send_backlog);
    let out_tx = OutSender::new(out_tx, backlog.clone());
    let (released_tx, released_rx) = mpsc::unbounded_channel();
    let close = portal_stop.child_token();
    session.connections.lock().retain(|c| c.cid != cid);
    session.connections.lock().push(ConnectionHandle {
        cid,
        portal: local,
        peer,
        stats: stats.clone(),
        close: close.clone(),
        released: released_tx,
    });
    let pool = Arc::new(BufferPool::default());
    let writer = Writer {
        pool: pool.clone(),
        sent: Vec::new(),
        socket: wr,
        session: session.clone(),
        stats: stats.clone(),
        framer,
        stat_sn,
        max_xmit: params.max_xmit_data_segment_length,
        max_burst: session.params.max_burst_length,
        backlog: backlog.clone(),
    };
    let writer = tokio::spawn(writer.run(out_rx));
    let mut conn = Connection {
        server: server.clone(),
        session: session.clone(),
        cid,
        params,
        framer,
        out: out_tx,
        writes: HashMap::new(),
        stats,
        next_ttt: 1,
        close,
        last_heard: Instant::now(),
        ping_outstanding: false,
        local,
        text: TextResponder::new(params.max_xmit_data_segment_length),
        text_exchange: Default::default(),
        peer,
        backlog,
        ready: Vec::new(),
        r2ts: Vec::new(),
        luns: session.target.as_ref().map(|t| t.luns.view()),
        read_piece: crate::data_in::read_piece(crate::data_in::Grid::new(
            params.max_xmit_data_segment_length,
            session.params.max_burst_length,
        )),
        pool,
    };
    let end = conn.serve(rd, buf, released_rx).await;
    debug!(tsih = session.tsih, cid, "connection ending: {end}");
    conn.abandon_writes();
    drop(conn.out);
    let mut writer = writer;
    // A peer that reads nothing keeps the writer waiting forever: give it what is queued up
    // to the NOP-In timeout, then abandon the socket.
    if tokio::time::timeout(server.config().nop_timeout, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    {
        let mut conns = session.connections.lock();
        if let Some(pos) = conns
            .iter()
            .position(|c| c.cid == cid && Arc::ptr_eq(&c.stats, &conn.stats))
        {
            conns.remove(pos);
        }
    }
    session.connection_ended.notify_waiters();
    let remaining = session.connection_count();
    info!(initiator = %session.initiator_name, %peer, tsih = session.tsih, cid, remaining, "connection closed");
    if remaining == 0 {
        // ErrorRecoveryLevel 0 with no connection left: the session ends (RFC 7143 7.1.5).
        session.close_all();
        session.drain().await;
        server.remove_session(&session);
    }
}

/// The receive side of a connection in full-feature phase.
pub(crate) struct Connection {
    server: Arc<Server>,
    session: Arc<Session>,
    cid: u16,
    params: ConnectionParams,
    framer: Framer,
    out: OutSender,
    writes: HashMap<u32, PendingWrite>,
    stats: Arc<ConnectionStats>,
    next_ttt: u32,
    close: CancellationToken,
    last_heard: Instant,
    ping_outstanding: bool,
    local: SocketAddr,
    text: TextResponder,
    /// Requests of the current text exchange, against `limits.text-rounds`.
    text_exchange: crate::limits::TextExchange,
    peer: SocketAddr,
    /// Responses queued and not yet written: while full, requests are not read.
    backlog: Arc<Backlog>,
    /// Data-In buffers, shared with the writer that returns them.
    pool: Arc<BufferPool>,
    /// The target's LUN map as of the last command (`None` in discovery sessions).
    luns: Option<crate::target::LunView>,
    /// Piece size of READs sent as they are read (asynchronous storage), on the writer's grid.
    read_piece: usize,
    /// Reused buffers: requests released in CmdSN order, R2Ts planned.
    ready: Vec<Pdu>,
    r2ts: Vec<R2tRequest>,
}

impl std::fmt::Display for ReadEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadEnd::Closed => write!(f, "closed by peer"),
            ReadEnd::Error(e) => write!(f, "{e}"),
            ReadEnd::Protocol(e) => write!(f, "{e}"),
        }
    }
}

impl Connection {
    async fn serve(
        &mut self,
        mut rd: OwnedReadHalf,
        mut buf: BytesMut,
        mut released: mpsc::UnboundedReceiver<ReleasedCommand>,
    ) -> ReadEnd {
        let (nop_interval, nop_timeout) = {
            let config = self.server.config();
            (config.nop_interval, config.nop_timeout)
        };
        let mut ticker = tokio::time::interval(nop_interval.max(Duration::from_millis(100)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            loop {
                match self.framer.decode(&mut buf) {
                    Ok(Some(pdu)) => {
                        self.last_heard = Instant::now();
                        self.ping_outstanding = false;
                        self.stats.add_in(BHS_LEN + pdu.data().len());
                        if let Err(end) = self.handle(pdu) {
                            return end;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => match self.pdu_error(e) {
                        Some(end) => return end,
                        None => continue,
                    },
                }
            }
            buf.reserve(self.framer.bytes_needed(&buf).max(64 * 1024));
            let backlogged = self.backlog.is_full();
            tokio::select! {
                r = rd.read_buf(&mut buf), if !backlogged => match r {
                    Ok(0) => return ReadEnd::Closed,
                    Ok(_) => {}
                    Err(e) => return ReadEnd::Error(e),
                },
                _ = self.backlog.drained(), if backlogged => {}
                Some(r) = released.recv() => {
                    if let Err(end) = self.handle_in_order(r.pdu, true) {
                        return end;
                    }
                }
                _ = self.close.cancelled() => return ReadEnd::Closed,
                _ = ticker.tick(), if !nop_interval.is_zero() => {
                    // A zero interval turns pings, and so the dead-peer timeout, off.
                    let idle = self.last_heard.elapsed();
                    if idle >= nop_timeout {
                        warn!(initiator = %self.session.initiator_name, tsih = self.session.tsih, cid = self.cid,
                            "no answer to NOP-In for {:?}; dropping connection", idle);
                        return ReadEnd::Closed;
                    }
                    if idle >= nop_interval && !self.ping_outstanding {
                        self.ping_outstanding = true;
                        let ttt = self.ttt();
                        self.send(Pdu::NopIn(NopIn { itt: RESERVED_TAG, ttt, ..NopIn::default() }));
                    }
                }
            }
        }
    }

    fn ttt(&mut self) -> u32 {
        next_tag(&mut self.next_ttt)
    }

    fn send(&self, pdu: Pdu) {
        let _ = self.out.send(Outbound::Pdu(pdu));
    }

    fn reject(&self, reason: u8, header: &[u8; BHS_LEN]) {
        self.send(Pdu::Reject(Reject {
            reason,
            data: Bytes::copy_from_slice(header),
            ..Reject::default()
        }));
    }

    /// RFC 7143 7.8 / 13.12: what to do about bytes that are not a valid PDU.
    fn pdu_error(&mut self, e: PduError) -> Option<ReadEnd> {
        warn!(initiator = %self.session.initiator_name, tsih = self.session.tsih, cid = self.cid, "bad PDU: {e}");
        match &e {
            PduError::DataDigest { header } => {
                self.reject(reject_reason::DATA_DIGEST_ERROR, header);
                None
            }
            PduError::Malformed { header, .. } => {
                self.reject(reject_reason::PROTOCOL_ERROR, header);
                let _ = self.out.send(Outbound::Close);
                Some(ReadEnd::Protocol(e))
            }
            PduError::DataSegmentTooLong { header, .. } => {
                self.reject(reject_reason::PROTOCOL_ERROR, header);
                let _ = self.out.send(Outbound::Close);
                Some(ReadEnd::Protocol(e))
            }
            PduError::HeaderDigest => Some(ReadEnd::Protocol(e)),
        }
    }

    /// Dispatches one received PDU.
    fn handle(&mut self, pdu: Pdu) -> Result<(), ReadEnd> {
        match &pdu {
            Pdu::DataOut(d) => {
                self.data_out(d);
                return Ok(());
            }
            Pdu::SnackRequest(_) => {
                // ErrorRecoveryLevel 0: SNACK is not supported (RFC 7143 11.16).
                let header = header_of(&pdu, &self.framer);
                self.reject(reject_reason::COMMAND_NOT_SUPPORTED, &header);
                return Ok(());
            }
            Pdu::NopOut(n) if n.ttt != RESERVED_TAG => {
                // The answer to our ping carries no CmdSN to consume.
                return Ok(());
            }
            Pdu::ScsiCommand(c) if self.session.target.is_none() => {
                let _ = c;
                let header = header_of(&pdu, &self.framer);
                self.reject(reject_reason::PROTOCOL_ERROR, &header);
                return Ok(());
            }
            Pdu::Unknown { header, .. } => {
                self.reject(reject_reason::COMMAND_NOT_SUPPORTED, header);
                return Ok(());
            }
            Pdu::LoginRequest(_) => {
                let header = header_of(&pdu, &self.framer);
                self.reject(reject_reason::PROTOCOL_ERROR, &header);
                return Ok(());
            }
            _ => {}
        }
        let Some((immediate, cmd_sn)) = ordering_of(&pdu) else {
            let header = header_of(&pdu, &self.framer);
            self.reject(reject_reason::PROTOCOL_ERROR, &header);
            return Ok(());
        };
        if immediate
            && crate::limits::too_many_immediate(
                &self.server.limits,
                &self.session,
                &pdu,
                self.peer,
            )
        {
            // RFC 7143 11.17.1: "immediate command reject - too many immediate commands".
            let header = header_of(&pdu, &self.framer);
            self.reject(reject_reason::IMMEDIATE_COMMAND_REJECT, &header);
            return Ok(());
        }
        if let Pdu::ScsiCommand(c) = &pdu {
            self.stats.commands.fetch_add(1, Ordering::Relaxed);
            if c.write && c.expected_data_length > 0 {
                // Data may arrive before the command's turn: collect it from now on.
                self.start_write(c);
            }
        }
        if immediate {
            return self.handle_in_order(pdu, false);
        }
        let itt = pdu.itt();
        let mut ready = std::mem::take(&mut self.ready);
        let result = match self.session.deliver(self.cid, cmd_sn, pdu, &mut ready) {
            Delivery::Accepted => {
                let mut result = Ok(());
                for p in ready.drain(..) {
                    if result.is_ok() {
                        result = self.handle_in_order(p, true);
                    } else {
                        self.session.request_done();
                    }
                }
                result
            }
            Delivery::Ignored => {
                debug!(cmd_sn, "request outside the CmdSN window ignored");
                if let Some(itt) = itt {
                    self.writes.remove(&itt);
                }
                Ok(())
            }
        };
        self.ready = ready;
        result
    }

    /// Processes a request whose turn in CmdSN order has come. `ordered`: it holds a slot of
    /// the CmdSN window, released when it ends.
    fn handle_in_order(&mut self, pdu: Pdu, ordered: bool) -> Result<(), ReadEnd> {
        let result = match pdu {
            Pdu::ScsiCommand(c) => {
                // The task releases its window slot when it ends.
                self.command(c, ordered);
                return Ok(());
            }
            Pdu::NopOut(n) => {
                if n.itt != RESERVED_TAG {
                    self.send(Pdu::NopIn(NopIn {
                        lun: n.lun,
                        itt: n.itt,
                        ttt: RESERVED_TAG,
                        data: n.data,
                        ..NopIn::default()
                    }));
                }
                Ok(())
            }
            Pdu::TextRequest(t) => {
                crate::text::handle(self, t);
                Ok(())
            }
            Pdu::TaskMgmtRequest(t) => {
                crate::tmf::handle(&self.server, &self.session, &self.out, t);
                Ok(())
            }
            Pdu::LogoutRequest(l) => self.logout(l),
            _ => Ok(()),
        };
        if ordered {
            self.session.request_done();
        }
        result
    }

    /// A SCSI command whose turn has come: execute now, or once its data is in.
    fn command(&mut self, c: ScsiCommand, ordered: bool) {
        self.session.task_started(
            c.itt,
            TaskEntry {
                lun: c.lun,
                cid: self.cid,
                aborted: false,
                tas: false,
                executing: false,
                ordered,
            },
        );
        let itt = c.itt;
        if let Some(w) = self.writes.get_mut(&itt) {
            w.command = Some(c);
            self.issue_r2ts(itt);
            self.try_execute_write(itt);
            return;
        }
        if !self.may_execute(&c) {
            return;
        }
        let luns = crate::target::LunView::current(&mut self.luns, self.session.target.as_deref());
        crate::exec::spawn(
            self.session.clone(),
            self.out.clone(),
            &self.pool,
            luns,
            c,
            Vec::new(),
            (0, 0),
            self.read_piece,
        );
    }

    /// Whether `c`, whose turn has come, runs now; if task management aborted it meanwhile
    /// it does not (answered TASK ABORTED when another nexus aborted it).
    pub(in crate::connection) fn may_execute(&self, c: &ScsiCommand) -> bool {
        match self.session.begin_execution(c.itt) {
            Begin::Execute => true,
            Begin::Over => false,
            Begin::AnswerAborted => {
                crate::exec::aborted(&self.session, &self.out, c);
                false
            }
        }
    }

    /// Logout (RFC 7143 11.14): close the session, this connection, or another one.
    fn logout(&mut self, l: LogoutRequest) -> Result<(), ReadEnd> {
        let respond = |response: u8| {
            Pdu::LogoutResponse(LogoutResponse {
                response,
                itt: l.itt,
                time2wait: 0,
                time2retain: 0,
                ..LogoutResponse::default()
            })
        };
        match l.reason {
            0 => {
                info!(initiator = %self.session.initiator_name, tsih = self.session.tsih, "logout (session)");
                self.session.closing.cancel();
                let session = self.session.clone();
                let server = self.server.clone();
                let me = self.cid;
                // Other connections close; this one closes once the response is out.
                for c in session.connections.lock().iter().filter(|c| c.cid != me) {
                    c.close.cancel();
                }
                // The I_T nexus ends before the answer (an SPC-2 reservation it held is gone
                // on both nodes of a pair when the initiator reads it).
                server.remove_session(&session);
                self.send(respond(0));
                let _ = self.out.send(Outbound::Close);
                Err(ReadEnd::Closed)
            }
            1 | 2 if l.cid == self.cid => {
                if l.reason == 2 {
                    // ErrorRecoveryLevel 0: no connection recovery (RFC 7143 11.15.1).
                    self.send(respond(2));
                    return Ok(());
                }
                self.send(respond(0));
                let _ = self.out.send(Outbound::Close);
                Err(ReadEnd::Closed)
            }
            1 | 2 => {
                let found = self
                    .session
                    .connections
                    .lock()
                    .iter()
                    .find(|c| c.cid == l.cid)
                    .map(|c| c.close.clone());
                match found {
                    Some(close) if l.reason == 1 => {
                        close.cancel();
                        // The answer waits until that connection has ended and none of its
                        // tasks is left: the initiator may then reissue them on another
                        // connection, and no old copy can execute after (RFC 7143 11.14).
                        let (session, out, cid) = (self.session.clone(), self.out.clone(), l.cid);
                        let response = respond(0);
                        tokio::spawn(async move {
                            session.connection_gone(cid).await;
                            let _ = out.send(Outbound::Pdu(response));
                        });
                    }
                    Some(_) => self.send(respond(2)),
                    None => self.send(respond(1)),
                }
                Ok(())
            }
            _ => {
                let header = header_of(&Pdu::LogoutRequest(l.clone()), &self.framer);
                self.reject(reject_reason::INVALID_PDU_FIELD, &header);
                Ok(())
            }
        }
    }
}

/// Hands out Target Transfer Tags, skipping the reserved 0xffffffff (RFC 7143 11.2.1.8) and 0.
fn next_tag(counter: &mut u32) -> u32 {
    let t = *counter;
    *counter = counter.wrapping_add(1);
    if *counter == RESERVED_TAG || *counter == 0 {
        *counter = 1;
    }
    t
}

/// The immediate flag and CmdSN of a request that is ordered by CmdSN.
fn ordering_of(pdu: &Pdu) -> Option<(bool, u32)> {
    match pdu {
        Pdu::ScsiCommand(p) => Some((p.immediate, p.cmd_sn)),
        Pdu::NopOut(p) => Some((p.immediate, p.cmd_sn)),
        Pdu::TaskMgmtRequest(p) => Some((p.immediate, p.cmd_sn)),
        Pdu::TextRequest(p) => Some((p.immediate, p.cmd_sn)),
        Pdu::LogoutRequest(p) => Some((p.immediate, p.cmd_sn)),
        _ => None,
    }
}

/// The BHS of a PDU, for a Reject's data segment.
fn header_of(pdu: &Pdu, framer: &Framer) -> [u8; BHS_LEN] {
    let e = framer.encode(pdu, &mut BytesMut::new());
    let mut h = [0u8; BHS_LEN];
    if let Some(src) = e.header.get(..BHS_LEN) {
        h.copy_from_slice(src);
    }
    h
}
