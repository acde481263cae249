//! The tokio driver: connect, log in, then pipeline SCSI commands up to the target's CmdSN
//! window. One reader task demultiplexes responses by ITT to the waiting commands (and answers
//! R2Ts and NOP-In pings); one writer task sends every PDU in the order it was queued, which is
//! CmdSN order because CmdSNs are assigned and PDUs queued under the same lock. The queue is
//! bounded by the window: no command is queued before its CmdSN fits under MaxCmdSN.

use bytes::{Bytes, BytesMut};
use iscsi_proto::pdu::*;
use iscsi_proto::{serial, text, Framer};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;

use crate::cdb;
use crate::login::{ChapSecret, InitiatorLogin, LoginParams, Negotiated, Offer, Step};
use crate::Error;

/// How long a TCP connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the target may take to answer one Login Request.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a command may wait for a window slot and then for its answer.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Who we are when logging in.
#[derive(Debug, Clone)]
pub struct LoginOptions {
    pub initiator_name: String,
    /// Initiator Session ID; `random_isid()` gives a fresh one per session.
    pub isid: [u8; 6],
    pub chap: Option<ChapSecret>,
    /// The LUN the session's SCSI commands address.
    pub lun: u64,
    pub offer: Offer,
}

impl LoginOptions {
    pub fn new(initiator_name: impl Into<String>) -> LoginOptions {
        LoginOptions {
            initiator_name: initiator_name.into(),
            isid: random_isid(),
            chap: None,
            lun: 0,
            offer: Offer::default(),
        }
    }
}

/// A random-format ISID (RFC 7143 11.12.5: T=0b10, random qualifier).
pub fn random_isid() -> [u8; 6] {
    let r: [u8; 5] = rand::random();
    let [a, b, c, d, e] = r;
    [0x80, a, b, c, d, e]
}

/// The end of one SCSI command.
#[derive(Debug, Clone, Default)]
pub struct ScsiOutcome {
    pub status: u8,
    /// iSCSI response code (0 = command completed at target).
    pub response: u8,
    pub sense: Bytes,
    pub data: Bytes,
    pub residual: u32,
}

impl ScsiOutcome {
    pub fn sense_triplet(&self) -> Option<(u8, u8, u8)> {
        cdb::sense_triplet(&self.sense)
    }

    fn unit_attention(&self) -> bool {
        self.status == cdb::CHECK_CONDITION
            && self.sense_triplet().map(|s| s.0) == Some(cdb::UNIT_ATTENTION)
    }

    fn check(self, command: &'static str) -> Result<ScsiOutcome, Error> {
        if self.response != 0 {
            return Err(Error::Protocol(format!(
                "{command}: iSCSI response {:#04x}",
                self.response
            )));
        }
        if self.status != 0 {
            return Err(Error::Scsi {
                command,
                status: self.status,
                sense: self.sense_triplet(),
            });
        }
        Ok(self)
    }
}

/// A command waiting for its answer.
struct Pending {
    /// Data to send on R2T (empty for reads).
    write: Bytes,
    /// Data-In collected so far, and the most the command may receive.
    read: BytesMut,
    expected: usize,
    reply: oneshot::Sender<Result<ScsiOutcome, Error>>,
}

struct State {
    cmd_sn: u32,
    exp_stat_sn: u32,
    max_cmd_sn: u32,
    next_itt: u32,
    pending: HashMap<u32, Pending>,
    /// None once the connection is gone.
    tx: Option<mpsc::UnboundedSender<Pdu>>,
}

struct Shared {
    state: Mutex<State>,
    window: Notify,
    addr: SocketAddr,
    max_send: usize,
    first_burst: usize,
    immediate_data: bool,
    initial_r2t: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic elsewhere; the counters are still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A logged-in iSCSI session over one connection.
pub struct Session {
    shared: Arc<Shared>,
    negotiated: Negotiated,
    lun: u64,
    block_size: AtomicU32,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

async fn connect(portal: SocketAddr) -> Result<TcpStream, Error> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(portal))
        .await
        .map_err(|_| Error::ConnectTimeout {
            addr: portal,
            secs: CONNECT_TIMEOUT.as_secs(),
        })?
        .map_err(|source| Error::Io {
            addr: portal,
            source,
        })?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Runs the login exchange on a fresh connection.
async fn login_exchange(
    stream: &mut TcpStream,
    portal: SocketAddr,
    params: LoginParams,
) -> Result<(Negotiated, BytesMut), Error> {
    let framer = Framer::default();
    let io = |source| Error::Io {
        addr: portal,
        source,
    };
    let (mut machine, mut req) = InitiatorLogin::new(params);
    let mut buf = BytesMut::with_capacity(16384);
    loop {
        let bytes = framer.encode_to_vec(&Pdu::LoginRequest(req));
        stream.write_all(&bytes).await.map_err(io)?;
        let resp = loop {
            match framer.decode(&mut buf) {
                Ok(Some(Pdu::LoginResponse(r))) => break r,
                Ok(Some(other)) => {
                    return Err(Error::Protocol(format!(
                        "expected a Login Response, got {:?}",
                        other.opcode()
                    )))
                }
                Ok(None) => {}
                Err(e) => return Err(Error::Protocol(format!("undecodable PDU: {e}"))),
            }
            let n = tokio::time::timeout(LOGIN_TIMEOUT, stream.read_buf(&mut buf))
                .await
                .map_err(|_| Error::Timeout("a Login Response"))?
                .map_err(io)?;
            if n == 0 {
                return Err(Error::ConnectionLost);
            }
        };
        match machine.handle(&resp)? {
            Step::Send(next) => req = next,
            Step::Complete(n) => return Ok((*n, buf)),
        }
    }
}

/// Resolves `host:port` (the first address), within the connect timeout.
pub async fn resolve(portal: &str) -> Result<SocketAddr, Error> {
    let mut addrs = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host(portal))
        .await
        .map_err(|_| Error::Timeout("name resolution"))?
        .map_err(|e| Error::InvalidRequest(format!("cannot resolve {portal}: {e}")))?;
    addrs
        .next()
        .ok_or_else(|| Error::InvalidRequest(format!("{portal} has no address")))
}

/// SendTargets=All on a discovery session: every target and its portals with their TPGTs.
pub async fn discover(
    portal: SocketAddr,
    options: &LoginOptions,
) -> Result<Vec<(String, Vec<(SocketAddr, u16)>)>, Error> {
    let session = Session::start(portal, None, options).await?;
    let data = session
        .text(text::encode(&[("SendTargets", "All")]))
        .await?;
    let _ = session.logout().await;
    let pairs = text::parse_allow_repeats(&data)
        .map_err(|e| Error::Protocol(format!("bad SendTargets answer: {e}")))?;
    let mut out: Vec<(String, Vec<(SocketAddr, u16)>)> = Vec::new();
    for (k, v) in pairs {
        match (k, out.last_mut()) {
            ("TargetName", _) => out.push((v.to_string(), Vec::new())),
            ("TargetAddress", Some((_, addrs))) => {
                let (addr, tag) = v.rsplit_once(',').unwrap_or((v, "1"));
                match (addr.parse::<SocketAddr>(), tag.parse::<u16>()) {
                    (Ok(a), Ok(t)) => addrs.push((a, t)),
                    _ => tracing::debug!(address = v, "skipping unusable TargetAddress"),
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The LUN field of a PDU (SAM-5 peripheral or flat addressing).
fn encode_lun(lun: u64) -> u64 {
    if lun < 256 {
        lun << 48
    } else {
        ((lun & 0x3fff) | 0x4000) << 48
    }
}

impl Session {
    /// Connects to `portal` and logs in to `target` (normal session, full feature phase).
    pub async fn login(
        portal: SocketAddr,
        target: &str,
        options: &LoginOptions,
    ) -> Result<Session, Error> {
        Session::start(portal, Some(target.to_string()), options).await
    }

    async fn start(
        portal: SocketAddr,
        target: Option<String>,
        options: &LoginOptions,
    ) -> Result<Session, Error> {
        let mut stream = connect(portal).await?;
        let params = LoginParams {
            initiator_name: options.initiator_name.clone(),
            target,
            isid: options.isid,
            cid: 1,
            cmd_sn: 1,
            chap: options.chap.clone(),
            offer: options.offer.clone(),
        };
        let (negotiated, leftover) = login_exchange(&mut stream, portal, params).await?;
        let framer = Framer {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: negotiated.max_recv_data_segment_length as usize,
        };
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                cmd_sn: negotiated.cmd_sn,
                exp_stat_sn: negotiated.exp_stat_sn,
                max_cmd_sn: negotiated.max_cmd_sn,
                next_itt: 1,
                pending: HashMap::new(),
                tx: Some(tx),
            }),
            window: Notify::new(),
            addr: portal,
            max_send: (negotiated.max_send_data_segment_length as usize).max(512),
            first_burst: negotiated.first_burst_length as usize,
            immediate_data: negotiated.immediate_data,
            initial_r2t: negotiated.initial_r2t,
        });
        let writer = tokio::spawn(write_loop(wr, rx));
        let reader = tokio::spawn(read_loop(rd, leftover, framer, shared.clone()));
        Ok(Session {
            shared,
            negotiated,
            lun: options.lun,
            block_size: AtomicU32::new(512),
            reader,
            writer,
        })
    }

    /// What the login negotiated.
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    pub fn portal(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Block size used by `read`/`write` (512 until `read_capacity16` reports another).
    pub fn block_size(&self) -> u32 {
        self.block_size.load(Ordering::Relaxed)
    }

    /// Takes a CmdSN inside the window and queues `build(cmd_sn, itt, exp_stat_sn)`'s PDUs.
    async fn issue(
        &self,
        immediate: bool,
        write: Bytes,
        read_capacity: usize,
        build: impl Fn(u32, u32, u32) -> Vec<Pdu>,
    ) -> Result<ScsiOutcome, Error> {
        let (tx, rx) = oneshot::channel();
        let deadline = tokio::time::Instant::now() + COMMAND_TIMEOUT;
        let itt = loop {
            let notified = self.shared.window.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.shared.lock();
                let Some(queue) = st.tx.clone() else {
                    return Err(Error::ConnectionLost);
                };
                if immediate || serial::le(st.cmd_sn, st.max_cmd_sn) {
                    let cmd_sn = st.cmd_sn;
                    if !immediate {
                        st.cmd_sn = st.cmd_sn.wrapping_add(1);
                    }
                    let mut itt = st.next_itt;
                    while itt == RESERVED_TAG || st.pending.contains_key(&itt) {
                        itt = itt.wrapping_add(1);
                    }
                    st.next_itt = itt.wrapping_add(1);
                    for pdu in build(cmd_sn, itt, st.exp_stat_sn) {
                        if queue.send(pdu).is_err() {
                            return Err(Error::ConnectionLost);
                        }
                    }
                    st.pending.insert(
                        itt,
                        Pending {
                            write: write.clone(),
                            read: BytesMut::with_capacity(read_capacity),
                            expected: read_capacity,
                            reply: tx,
                        },
                    );
                    break itt;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(Error::Timeout("a CmdSN window slot"));
            }
        };
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::ConnectionLost),
            Err(_) => {
                self.shared.lock().pending.remove(&itt);
                Err(Error::Timeout("a command's response"))
            }
        }
    }

    /// Runs one SCSI command. `write` carries the Data-Out; `read_len` the expected Data-In.
    pub async fn execute(
        &self,
        cdb: [u8; 16],
        read_len: u32,
        write: Option<Bytes>,
    ) -> Result<ScsiOutcome, Error> {
        let sh = &self.shared;
        let lun = encode_lun(self.lun);
        let data = write.clone().unwrap_or_default();
        let len = data.len();
        let edtl = if write.is_some() {
            u32::try_from(len).map_err(|_| Error::InvalidRequest("write too large".into()))?
        } else {
            read_len
        };
        let imm = if sh.immediate_data {
            len.min(sh.max_send).min(sh.first_burst)
        } else {
            0
        };
        let unsolicited_end = if sh.initial_r2t {
            imm
        } else {
            len.min(sh.first_burst).max(imm)
        };
        let build = |cmd_sn: u32, itt: u32, exp_stat_sn: u32| {
            let mut pdus = Vec::with_capacity(1 + (unsolicited_end - imm) / sh.max_send.max(1));
            pdus.push(Pdu::ScsiCommand(ScsiCommand {
                immediate: false,
                final_bit: unsolicited_end == imm,
                read: write.is_none() && read_len > 0,
                write: write.is_some(),
                attr: task_attr::SIMPLE,
                lun,
                itt,
                expected_data_length: edtl,
                cmd_sn,
                exp_stat_sn,
                cdb,
                extended_cdb: None,
                bidi_read_length: None,
                data: data.slice(..imm),
            }));
            data_out(
                &mut pdus,
                &data,
                imm,
                unsolicited_end,
                sh.max_send,
                (lun, itt, RESERVED_TAG, exp_stat_sn),
            );
            pdus
        };
        self.issue(false, data.clone(), read_len as usize, build)
            .await
    }

    /// Runs a command again while it reports UNIT ATTENTION (each is reported once).
    async fn execute_retrying(
        &self,
        name: &'static str,
        cdb: [u8; 16],
        read_len: u32,
        write: Option<Bytes>,
    ) -> Result<ScsiOutcome, Error> {
        let mut tries = 0;
        loop {
            let out = self.execute(cdb, read_len, write.clone()).await?;
            tries += 1;
            if out.unit_attention() && tries < 8 {
                continue;
            }
            return out.check(name);
        }
    }

    /// READ(16) of `blocks` blocks at `lba`.
    pub async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, Error> {
        let len = blocks
            .checked_mul(self.block_size())
            .ok_or_else(|| Error::InvalidRequest("read too large".into()))?;
        let out = self
            .execute_retrying("READ(16)", cdb::read16(lba, blocks), len, None)
            .await?;
        Ok(out.data)
    }

    /// WRITE(16) of `data` (whole blocks) at `lba`.
    pub async fn write(&self, lba: u64, data: &[u8]) -> Result<(), Error> {
        self.write_bytes(lba, Bytes::copy_from_slice(data)).await
    }

    /// WRITE(16) without copying the caller's buffer.
    pub async fn write_bytes(&self, lba: u64, data: Bytes) -> Result<(), Error> {
        let bs = self.block_size() as usize;
        if data.is_empty() || !data.len().is_multiple_of(bs) {
            return Err(Error::InvalidRequest(format!(
                "write of {} bytes is not a whole number of {bs}-byte blocks",
                data.len()
            )));
        }
        let blocks = u32::try_from(data.len() / bs)
            .map_err(|_| Error::InvalidRequest("write too large".into()))?;
        self.execute_retrying("WRITE(16)", cdb::write16(lba, blocks), 0, Some(data))
            .await
            .map(|_| ())
    }

    /// TEST UNIT READY, consuming pending unit attentions (such as the one after login).
    pub async fn test_unit_ready(&self) -> Result<(), Error> {
        self.execute_retrying("TEST UNIT READY", cdb::test_unit_ready(), 0, None)
            .await
            .map(|_| ())
    }

    /// INQUIRY: standard data (`None`) or a VPD page.
    pub async fn inquiry(&self, vpd_page: Option<u8>) -> Result<Bytes, Error> {
        let out = self
            .execute_retrying("INQUIRY", cdb::inquiry(vpd_page, 4096), 4096, None)
            .await?;
        Ok(out.data)
    }

    /// READ CAPACITY(16): (number of blocks, block size). Sets the session's block size.
    pub async fn read_capacity16(&self) -> Result<(u64, u32), Error> {
        let out = self
            .execute_retrying("READ CAPACITY(16)", cdb::read_capacity16(), 32, None)
            .await?;
        let d = &out.data;
        let (Some(last), Some(bs)) = (d.get(0..8), d.get(8..12)) else {
            return Err(Error::Protocol("short READ CAPACITY(16) data".into()));
        };
        let last = u64::from_be_bytes(last.try_into().unwrap_or_default());
        let bs = u32::from_be_bytes(bs.try_into().unwrap_or_default());
        if !(512..=65536).contains(&bs) || !bs.is_power_of_two() {
            return Err(Error::Protocol(format!("implausible block size {bs}")));
        }
        self.block_size.store(bs, Ordering::Relaxed);
        Ok((last.saturating_add(1), bs))
    }

    /// A text exchange (discovery); continuations are not supported in this slice.
    async fn text(&self, data: Bytes) -> Result<Bytes, Error> {
        let out = self
            .issue(false, Bytes::new(), 0, |cmd_sn, itt, exp_stat_sn| {
                vec![Pdu::TextRequest(TextRequest {
                    immediate: false,
                    final_bit: true,
                    continue_bit: false,
                    lun: 0,
                    itt,
                    ttt: RESERVED_TAG,
                    cmd_sn,
                    exp_stat_sn,
                    data: data.clone(),
                })]
            })
            .await?;
        Ok(out.data)
    }

    /// Logs the session out (reason 0: close the session) and closes the connection.
    pub async fn logout(self) -> Result<(), Error> {
        let out = self
            .issue(true, Bytes::new(), 0, |cmd_sn, itt, exp_stat_sn| {
                vec![Pdu::LogoutRequest(LogoutRequest {
                    immediate: true,
                    reason: 0,
                    itt,
                    cid: 1,
                    cmd_sn,
                    exp_stat_sn,
                })]
            })
            .await?;
        if out.response != 0 {
            return Err(Error::Protocol(format!(
                "logout answered with response {}",
                out.response
            )));
        }
        Ok(())
    }
}

/// Queues Data-Out PDUs for `data[from..to]`, cut at `max_send`, DataSN from 0.
fn data_out(
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

async fn write_loop(wr: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Pdu>) {
    let framer = Framer::default();
    let mut scratch = BytesMut::with_capacity(4096);
    let mut out = BufWriter::with_capacity(256 << 10, wr);
    while let Some(pdu) = rx.recv().await {
        let mut next = Some(pdu);
        // Everything queued now goes out with one flush.
        while let Some(pdu) = next {
            let e = framer.encode(&pdu, &mut scratch);
            if out.write_all(&e.header).await.is_err()
                || out.write_all(&e.data).await.is_err()
                || out.write_all(e.trailer()).await.is_err()
            {
                return;
            }
            next = rx.try_recv().ok();
        }
        if out.flush().await.is_err() {
            return;
        }
    }
}

async fn read_loop(mut rd: OwnedReadHalf, mut buf: BytesMut, framer: Framer, shared: Arc<Shared>) {
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
        buf.reserve(framer.bytes_needed(&buf).max(64 << 10));
        match rd.read_buf(&mut buf).await {
            Ok(0) => break Error::ConnectionLost,
            Ok(_) => {}
            Err(_) => break Error::ConnectionLost,
        }
    };
    tracing::debug!(portal = %shared.addr, "session ends: {reason}");
    let pending: Vec<Pending> = {
        let mut st = shared.lock();
        st.tx = None;
        st.pending.drain().map(|(_, p)| p).collect()
    };
    for p in pending {
        let _ = p.reply.send(Err(Error::ConnectionLost));
    }
    shared.window.notify_waiters();
}

/// One PDU from the target. An error ends the connection.
fn handle(shared: &Shared, pdu: Pdu) -> Result<(), Error> {
    let mut st = shared.lock();
    let (stat_sn, max_cmd_sn, advances) = match &pdu {
        Pdu::ScsiResponse(r) => (r.stat_sn, r.max_cmd_sn, true),
        Pdu::DataIn(d) => (d.stat_sn, d.max_cmd_sn, d.status_present),
        Pdu::NopIn(n) => (n.stat_sn, n.max_cmd_sn, n.itt != RESERVED_TAG),
        Pdu::TaskMgmtResponse(r) => (r.stat_sn, r.max_cmd_sn, true),
        Pdu::TextResponse(r) => (r.stat_sn, r.max_cmd_sn, true),
        Pdu::LogoutResponse(r) => (r.stat_sn, r.max_cmd_sn, true),
        Pdu::Reject(r) => (r.stat_sn, r.max_cmd_sn, true),
        Pdu::R2t(r) => (r.stat_sn, r.max_cmd_sn, false),
        Pdu::AsyncMessage(r) => (r.stat_sn, r.max_cmd_sn, true),
        other => {
            return Err(Error::Protocol(format!(
                "unexpected {:?} in full feature phase",
                other.opcode()
            )))
        }
    };
    if advances && serial::le(st.exp_stat_sn, stat_sn) {
        st.exp_stat_sn = stat_sn.wrapping_add(1);
    }
    if serial::gt(max_cmd_sn, st.max_cmd_sn) {
        st.max_cmd_sn = max_cmd_sn;
        shared.window.notify_waiters();
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
            if p.read.len() < end {
                p.read.resize(end, 0);
            }
            if let Some(dst) = p.read.get_mut(off..end) {
                dst.copy_from_slice(&d.data);
            }
            if d.status_present {
                if let Some(p) = st.pending.remove(&d.itt) {
                    let _ = p.reply.send(Ok(ScsiOutcome {
                        status: d.status,
                        response: 0,
                        sense: Bytes::new(),
                        data: p.read.freeze(),
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
                    data: p.read.freeze(),
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
                    cmd_sn: st.cmd_sn,
                    exp_stat_sn: st.exp_stat_sn,
                    data: Bytes::new(),
                });
                if let Some(q) = &st.tx {
                    let _ = q.send(reply);
                }
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
