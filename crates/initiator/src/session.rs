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
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::cdb;
use crate::connection::{
    data_out, read_loop, write_loop, Pending, ReadBuffer, Shared, State, Window,
};
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
    /// The local network interface the connection must leave through (SO_BINDTODEVICE), so
    /// that paths to portals on one subnet (a mesh) each use their own NIC.
    pub bind_device: Option<String>,
}

impl LoginOptions {
    pub fn new(initiator_name: impl Into<String>) -> LoginOptions {
        LoginOptions {
            initiator_name: initiator_name.into(),
            isid: random_isid(),
            chap: None,
            lun: 0,
            offer: Offer::default(),
            bind_device: None,
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

/// Removes a command's entry from the pending table when its waiter goes away.
struct PendingGuard<'a> {
    shared: &'a Shared,
    itt: u32,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.lock().pending.remove(&self.itt);
    }
}

/// A logged-in iSCSI session over one connection.
pub struct Session {
    pub(crate) shared: Arc<Shared>,
    cid: u16,
    negotiated: Negotiated,
    pub(crate) lun: u64,
    block_size: AtomicU32,
    pub(crate) reader: JoinHandle<()>,
    pub(crate) writer: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

async fn connect(portal: SocketAddr, bind_device: Option<&str>) -> Result<TcpStream, Error> {
    let io = |source| Error::Io {
        addr: portal,
        source,
    };
    let socket = if portal.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(io)?;
    if let Some(dev) = bind_device {
        socket
            .bind_device(Some(dev.as_bytes()))
            .map_err(|source| Error::Io {
                addr: portal,
                source: std::io::Error::new(
                    source.kind(),
                    format!("binding to interface {dev}: {source}"),
                ),
            })?;
    }
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(portal))
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
    let session = Session::start(portal, None, options, None, 1).await?;
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
pub(crate) fn encode_lun(lun: u64) -> u64 {
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
        Session::start(portal, Some(target.to_string()), options, None, 1).await
    }

    /// Adds a connection with `cid` through `portal` to this session (MC/S, RFC 7143 3.3): it
    /// shares the session's CmdSN window and its session-wide parameters. `options` must carry
    /// this session's ISID.
    pub async fn add_connection(
        &self,
        portal: SocketAddr,
        target: &str,
        options: &LoginOptions,
        cid: u16,
    ) -> Result<Session, Error> {
        Session::start(portal, Some(target.to_string()), options, Some(self), cid).await
    }

    /// The connection ID this session object drives.
    pub fn cid(&self) -> u16 {
        self.cid
    }

    async fn start(
        portal: SocketAddr,
        target: Option<String>,
        options: &LoginOptions,
        lead: Option<&Session>,
        cid: u16,
    ) -> Result<Session, Error> {
        let mut stream = connect(portal, options.bind_device.as_deref()).await?;
        let (tsih, cmd_sn) = match lead {
            Some(l) => (l.negotiated.tsih, l.shared.window.lock().cmd_sn),
            None => (0, 1),
        };
        let params = LoginParams {
            initiator_name: options.initiator_name.clone(),
            target,
            isid: options.isid,
            tsih,
            cid,
            cmd_sn,
            chap: options.chap.clone(),
            offer: options.offer.clone(),
        };
        let (mut negotiated, leftover) = login_exchange(&mut stream, portal, params).await?;
        if let Some(l) = lead {
            // Session-wide values were negotiated by the leading connection.
            let ln = &l.negotiated;
            negotiated.max_burst_length = ln.max_burst_length;
            negotiated.first_burst_length = ln.first_burst_length;
            negotiated.max_outstanding_r2t = ln.max_outstanding_r2t;
            negotiated.immediate_data = ln.immediate_data;
            negotiated.initial_r2t = ln.initial_r2t;
        }
        let join = lead.map(|l| l.shared.window.clone());
        let framer = Framer {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: negotiated.max_recv_data_segment_length as usize,
        };
        let socket = {
            use std::os::fd::AsFd;
            stream.as_fd().try_clone_to_owned().ok()
        };
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let window = match join {
            Some(w) => w,
            None => Arc::new(Window::new(negotiated.cmd_sn, negotiated.max_cmd_sn)),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                exp_stat_sn: negotiated.exp_stat_sn,
                pending: HashMap::new(),
                tx: Some(tx),
            }),
            socket: Mutex::new(socket),
            lost: Mutex::new(Vec::new()),
            window,
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
            cid,
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
    pub(crate) async fn issue(
        &self,
        immediate: bool,
        at: Option<u32>,
        write: Bytes,
        read_capacity: usize,
        build: impl Fn(u32, u32, u32) -> Vec<Pdu>,
    ) -> Result<ScsiOutcome, Error> {
        let (tx, rx) = oneshot::channel();
        let deadline = tokio::time::Instant::now() + COMMAND_TIMEOUT;
        let itt = loop {
            let window = &self.shared.window;
            let notified = window.opened.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut w = window.lock();
                let fixed = at.is_some();
                if immediate || fixed || serial::le(w.cmd_sn, w.max_cmd_sn) {
                    let mut st = self.shared.lock();
                    // A dead connection must not take a CmdSN: that would leave a hole.
                    let Some(queue) = st.tx.clone() else {
                        return Err(Error::ConnectionLost);
                    };
                    let cmd_sn = at.unwrap_or(w.cmd_sn);
                    if !immediate && !fixed {
                        w.cmd_sn = w.cmd_sn.wrapping_add(1);
                    }
                    let mut itt = w.next_itt;
                    while itt == RESERVED_TAG || st.pending.contains_key(&itt) {
                        itt = itt.wrapping_add(1);
                    }
                    w.next_itt = itt.wrapping_add(1);
                    drop(w);
                    for pdu in build(cmd_sn, itt, st.exp_stat_sn) {
                        if queue.send(pdu).is_err() {
                            return Err(Error::ConnectionLost);
                        }
                    }
                    st.pending.insert(
                        itt,
                        Pending {
                            write: write.clone(),
                            read: ReadBuffer::Empty,
                            expected: read_capacity,
                            cmd_sn: (!immediate).then_some(cmd_sn),
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
        // A caller that stops waiting (a timeout of its own, a dropped future) must not leave
        // its entry behind: an answer that never comes would hold the ITT forever.
        let guard = PendingGuard {
            shared: &self.shared,
            itt,
        };
        let result = match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::ConnectionLost),
            Err(_) => Err(Error::Timeout("a command's response")),
        };
        drop(guard);
        result
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
        self.issue(false, None, data.clone(), read_len as usize, build)
            .await
    }

    /// Runs a command again while it reports UNIT ATTENTION (each is reported once).
    pub(crate) async fn execute_retrying(
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
            .issue(false, None, Bytes::new(), 0, |cmd_sn, itt, exp_stat_sn| {
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
            .issue(true, None, Bytes::new(), 0, |cmd_sn, itt, exp_stat_sn| {
                vec![Pdu::LogoutRequest(LogoutRequest {
                    immediate: true,
                    reason: 0,
                    itt,
                    cid: self.cid,
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
