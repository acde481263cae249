//! Test-only iSCSI initiator over blocking loopback sockets, and an in-process target fixture.
//!
//! The client is deliberately small and strict: every wait has a timeout (so a hung target
//! fails the test instead of hanging it), every PDU goes through `iscsi_proto::Framer`, and
//! NOP-In pings from the target are answered wherever the client is waiting.
#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use iscsi_proto::chap::ChapAlgorithm;
use iscsi_proto::pdu::*;
use iscsi_proto::text;
use lanes_test_support::config::ConfigToml;
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Longest the client waits for any single answer.
pub const TIMEOUT: Duration = Duration::from_secs(20);

pub const INITIATOR: &str = "iqn.2026-01.test.lanes:client";
pub const TARGET: &str = "iqn.2026-01.test.lanes:target";

/// Deterministic pseudo-random bytes (xorshift64*), so failures reproduce.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A small PRNG for fuzz-style tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

// ---------------------------------------------------------------------------------------------
// In-process target fixture
// ---------------------------------------------------------------------------------------------

/// A target started in this process on its own tokio runtime; stopped on drop.
pub struct TestServer {
    rt: Option<tokio::runtime::Runtime>,
    handle: Option<lanes_iscsi_target::ServerHandle>,
    pub dir: tempfile::TempDir,
    /// (TPGT, bound address) as the server reports them.
    pub portals: Vec<(u16, SocketAddr)>,
}

impl TestServer {
    /// Starts a target from a TOML configuration. `{dir}` in `toml` is replaced by the temp dir.
    pub fn start(toml: &str) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = toml.replace("{dir}", &dir.path().display().to_string());
        let config = lanes_iscsi_target::config::ServeConfig::from_toml_str(
            &text,
            &dir.path().join("lanes.toml"),
        )
        .unwrap_or_else(|e| panic!("config: {e}\n{text}"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let handle = rt
            .block_on(lanes_iscsi_target::start(config))
            .unwrap_or_else(|e| panic!("start: {e}"));
        let portals = handle.info.portals.clone();
        TestServer {
            rt: Some(rt),
            handle: Some(handle),
            dir,
            portals,
        }
    }

    /// Starts a target from a configuration file `{dir}/lanes.toml` written from `toml`, so
    /// that [`TestServer::reload`] can re-read it.
    pub fn start_file(toml: &str) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("lanes.toml");
        let text = toml.replace("{dir}", &dir.path().display().to_string());
        std::fs::write(&file, &text).expect("write lanes.toml");
        let cli = lanes_iscsi_target::config::CliOverrides {
            config: Some(file.clone()),
            ..Default::default()
        };
        let config = lanes_iscsi_target::config::ServeConfig::from_cli(&cli)
            .unwrap_or_else(|e| panic!("config: {e}\n{text}"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let source = lanes_iscsi_target::ConfigSource::from_cli(&cli);
        let handle = rt
            .block_on(lanes_iscsi_target::start_with(config, source))
            .unwrap_or_else(|e| panic!("start: {e}"));
        let portals = handle.info.portals.clone();
        TestServer {
            rt: Some(rt),
            handle: Some(handle),
            dir,
            portals,
        }
    }

    /// Rewrites `{dir}/lanes.toml` (`{dir}` replaced as in [`TestServer::start_file`]).
    pub fn rewrite(&self, toml: &str) {
        let text = toml.replace("{dir}", &self.dir.path().display().to_string());
        std::fs::write(self.dir.path().join("lanes.toml"), text).expect("rewrite lanes.toml");
    }

    /// Asks the running server to re-read its configuration.
    pub fn reload(
        &self,
    ) -> Result<lanes_iscsi_target::ReloadReport, lanes_iscsi_target::ReloadError> {
        let (Some(rt), Some(handle)) = (&self.rt, &self.handle) else {
            panic!("server stopped");
        };
        rt.block_on(handle.reload())
    }

    /// The configuration the server runs now.
    pub fn running_config(&self) -> lanes_iscsi_target::config::ServeConfig {
        let handle = self.handle.as_ref().expect("server running");
        (*handle.running_config()).clone()
    }

    /// (TPGT, bound address) of every listening portal now.
    pub fn listening(&self) -> Vec<(u16, SocketAddr)> {
        self.handle.as_ref().expect("server running").listening()
    }

    /// One target, one 16 MiB LUN, one portal group on 127.0.0.1 (port chosen by the kernel).
    pub fn simple(target_extra: &str) -> TestServer {
        TestServer::start(&simple_toml(target_extra))
    }

    pub fn addr(&self) -> SocketAddr {
        self.portals[0].1
    }

    /// Shuts the server's runtime down without stopping the server first, as a process that
    /// drops its runtime does.
    pub fn drop_runtime(mut self) {
        drop(self.rt.take());
        drop(self.handle.take());
    }

    pub fn lun_path(&self) -> std::path::PathBuf {
        self.dir.path().join("disk0.img")
    }

    pub fn status_socket(&self) -> std::path::PathBuf {
        self.dir.path().join("data").join("lanes.sock")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let (Some(rt), Some(h)) = (self.rt.take(), self.handle.take()) {
            rt.block_on(async {
                let _ = tokio::time::timeout(Duration::from_secs(20), h.stop()).await;
            });
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

pub fn simple_toml(target_extra: &str) -> String {
    ConfigToml::new("{dir}", TARGET)
        .server("nop-interval = \"30s\"\nnop-timeout = \"120s\"")
        .target_lines(target_extra)
        .build()
}

// ---------------------------------------------------------------------------------------------
// Login options and results
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct Chap {
    pub user: String,
    pub secret: Vec<u8>,
    pub algorithm: u8,
    /// Mutual CHAP: (expected target user, target secret).
    pub mutual: Option<(String, Vec<u8>)>,
}

#[derive(Clone, Debug)]
pub struct LoginOpts {
    pub initiator: String,
    /// None = discovery session.
    pub target: Option<String>,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub cid: u16,
    pub cmd_sn: u32,
    pub chap: Option<Chap>,
    pub header_digest: bool,
    pub data_digest: bool,
    /// Our MaxRecvDataSegmentLength.
    pub max_recv: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub first_burst: u32,
    pub max_burst: u32,
    pub max_connections: u32,
}

impl LoginOpts {
    pub fn normal() -> LoginOpts {
        LoginOpts {
            initiator: INITIATOR.into(),
            target: Some(TARGET.into()),
            isid: [0x80, 0, 0, 0x12, 0x34, 0x01],
            tsih: 0,
            cid: 1,
            cmd_sn: 1,
            chap: None,
            header_digest: false,
            data_digest: false,
            max_recv: 65536,
            initial_r2t: false,
            immediate_data: true,
            first_burst: 65536,
            max_burst: 262144,
            max_connections: 4,
        }
    }

    pub fn discovery() -> LoginOpts {
        LoginOpts {
            target: None,
            ..LoginOpts::normal()
        }
    }
}

/// A login that did not reach the full-feature phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginError {
    /// A Login Response with a non-zero status.
    Status(u8, u8),
    /// Anything else (connection closed, bad answer).
    Other(String),
}

/// What the login negotiated.
#[derive(Debug, Clone, Default)]
pub struct Negotiated {
    pub keys: HashMap<String, String>,
    pub tsih: u16,
    pub tpgt: Option<u16>,
}

// ---------------------------------------------------------------------------------------------
// The connection
// ---------------------------------------------------------------------------------------------

/// Result of one SCSI command.
#[derive(Debug, Clone, Default)]
pub struct ScsiResult {
    pub status: u8,
    pub response: u8,
    pub sense: Vec<u8>,
    pub data: Vec<u8>,
    pub overflow: bool,
    pub underflow: bool,
    pub residual: u32,
    pub r2ts: u32,
    pub data_in_pdus: u32,
}

impl ScsiResult {
    /// (sense key, ASC, ASCQ) of fixed or descriptor format sense.
    pub fn sense_triplet(&self) -> Option<(u8, u8, u8)> {
        let s = &self.sense;
        match s.first().map(|b| b & 0x7f) {
            Some(0x70) | Some(0x71) if s.len() >= 14 => Some((s[2] & 0x0f, s[12], s[13])),
            Some(0x72) | Some(0x73) if s.len() >= 4 => Some((s[1] & 0x0f, s[2], s[3])),
            _ => None,
        }
    }
}

pub struct Conn {
    pub stream: TcpStream,
    pub framer: Framer,
    buf: BytesMut,
    stash: VecDeque<Pdu>,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    next_itt: u32,
    /// The target's MaxRecvDataSegmentLength (what we may send).
    pub max_xmit: usize,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub first_burst: u32,
    pub max_burst: u32,
    pub negotiated: Negotiated,
    /// Last MaxCmdSN seen.
    pub max_cmd_sn: u32,
    pub exp_cmd_sn: u32,
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect_timeout(&addr, TIMEOUT)
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            stream,
            framer: Framer::default(),
            buf: BytesMut::new(),
            stash: VecDeque::new(),
            isid: [0; 6],
            tsih: 0,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
            next_itt: 0x100,
            max_xmit: 8192,
            immediate_data: true,
            initial_r2t: true,
            first_burst: 65536,
            max_burst: 262144,
            negotiated: Negotiated::default(),
            max_cmd_sn: 0,
            exp_cmd_sn: 0,
        }
    }

    /// Connects and logs in; panics if the login fails. For a normal session, the power-on
    /// unit attention is consumed so the first test command sees GOOD status.
    pub fn login_to(addr: SocketAddr, opts: &LoginOpts) -> Conn {
        let mut c = Conn::connect(addr);
        c.login(opts)
            .unwrap_or_else(|e| panic!("login to {addr} failed: {e:?}"));
        if opts.target.is_some() {
            c.clear_unit_attentions();
        }
        c
    }

    /// TEST UNIT READY until GOOD (each pending unit attention is reported once).
    pub fn clear_unit_attentions(&mut self) {
        for _ in 0..8 {
            let (status, sense) = self.tur();
            if status == 0 {
                return;
            }
            assert_eq!(sense.map(|s| s.0), Some(6), "only unit attentions expected");
        }
        panic!("unit attentions never cleared");
    }

    pub fn itt(&mut self) -> u32 {
        self.next_itt = self.next_itt.wrapping_add(1);
        self.next_itt
    }

    // ---- raw I/O ----

    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    pub fn send(&mut self, pdu: &Pdu) {
        let bytes = self.framer.encode_to_vec(pdu);
        self.stream
            .write_all(&bytes)
            .unwrap_or_else(|e| panic!("send {:?}: {e}", pdu.opcode()));
    }

    /// Sends, reporting failure instead of panicking (the target may have closed).
    pub fn try_send(&mut self, pdu: &Pdu) -> std::io::Result<()> {
        let bytes = self.framer.encode_to_vec(pdu);
        self.stream.write_all(&bytes)
    }

    /// The next PDU from the target (stashed ones first), without any handling.
    pub fn recv_raw(&mut self, timeout: Duration) -> Result<Pdu, String> {
        if let Some(p) = self.stash.pop_front() {
            return Ok(p);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.framer.decode(&mut self.buf) {
                Ok(Some(p)) => return Ok(p),
                Ok(None) => {}
                Err(e) => return Err(format!("undecodable PDU from target: {e}")),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err("timeout".into());
            }
            self.stream
                .set_read_timeout(Some(deadline - now))
                .map_err(|e| e.to_string())?;
            let mut chunk = [0u8; 65536];
            let r = self.stream.read(&mut chunk);
            let _ = self.stream.set_read_timeout(Some(TIMEOUT));
            match r {
                Ok(0) => return Err("eof".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err("timeout".into())
                }
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }

    /// The next PDU, answering target NOP-In pings and tracking StatSN/MaxCmdSN on the way.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Pdu, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let p = self.recv_raw(left)?;
            self.track(&p);
            if let Pdu::NopIn(n) = &p {
                if n.itt == RESERVED_TAG && n.ttt != RESERVED_TAG {
                    let reply = Pdu::NopOut(NopOut {
                        immediate: true,
                        lun: n.lun,
                        itt: RESERVED_TAG,
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                        data: Bytes::new(),
                    });
                    let _ = self.try_send(&reply);
                    continue;
                }
            }
            return Ok(p);
        }
    }

    pub fn recv(&mut self) -> Result<Pdu, String> {
        self.recv_timeout(TIMEOUT)
    }

    fn track(&mut self, p: &Pdu) {
        let (stat_sn, exp, max, advances) = match p {
            Pdu::ScsiResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Pdu::DataIn(d) => (d.stat_sn, d.exp_cmd_sn, d.max_cmd_sn, d.status_present),
            Pdu::NopIn(n) => (n.stat_sn, n.exp_cmd_sn, n.max_cmd_sn, n.itt != RESERVED_TAG),
            Pdu::TaskMgmtResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Pdu::TextResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Pdu::LogoutResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Pdu::Reject(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Pdu::R2t(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, false),
            Pdu::AsyncMessage(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            _ => return,
        };
        if advances {
            self.exp_stat_sn = stat_sn.wrapping_add(1);
        }
        self.exp_cmd_sn = exp;
        self.max_cmd_sn = max;
    }

    /// Puts a PDU back so the next `recv` returns it.
    pub fn unread(&mut self, p: Pdu) {
        self.stash.push_back(p);
    }

    /// Waits until the target closes the connection. Returns false on timeout.
    /// PDUs that arrive meanwhile are returned in the vector.
    pub fn wait_closed(&mut self, timeout: Duration) -> (bool, Vec<Pdu>) {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return (false, seen);
            }
            match self.recv_raw(left) {
                Ok(p) => seen.push(p),
                Err(e) if e == "timeout" => return (false, seen),
                Err(_) => return (true, seen),
            }
        }
    }

    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    // ---- login ----

    fn login_pdu(
        &mut self,
        opts: &LoginOpts,
        csg: u8,
        transit: bool,
        nsg: u8,
        keys: &[(String, String)],
    ) -> Result<(LoginResponse, Vec<(String, String)>), LoginError> {
        let req = Pdu::LoginRequest(LoginRequest {
            transit,
            continue_bit: false,
            csg,
            nsg: if transit { nsg } else { 0 },
            version_max: 0,
            version_min: 0,
            isid: opts.isid,
            tsih: opts.tsih,
            itt: 0x4c47_0000 | u32::from(opts.cid),
            cid: opts.cid,
            cmd_sn: opts.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            data: text::encode(keys),
        });
        self.try_send(&req)
            .map_err(|e| LoginError::Other(format!("send: {e}")))?;
        let resp = match self.recv_raw(TIMEOUT) {
            Ok(Pdu::LoginResponse(r)) => r,
            Ok(other) => {
                return Err(LoginError::Other(format!(
                    "not a login response: {other:?}"
                )))
            }
            Err(e) => return Err(LoginError::Other(e)),
        };
        self.exp_stat_sn = resp.stat_sn.wrapping_add(1);
        self.exp_cmd_sn = resp.exp_cmd_sn;
        self.max_cmd_sn = resp.max_cmd_sn;
        if resp.status_class != 0 {
            return Err(LoginError::Status(resp.status_class, resp.status_detail));
        }
        let pairs = text::parse_allow_repeats(&resp.data)
            .map_err(|e| LoginError::Other(format!("bad login text: {e}")))?
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>();
        for (k, v) in &pairs {
            self.negotiated.keys.insert(k.clone(), v.clone());
        }
        Ok((resp, pairs))
    }

    /// Runs a whole login. On success the connection is in full-feature phase.
    pub fn login(&mut self, opts: &LoginOpts) -> Result<Negotiated, LoginError> {
        fn kv(k: &str, v: impl ToString) -> (String, String) {
            (k.to_string(), v.to_string())
        }
        self.isid = opts.isid;
        self.cid = opts.cid;
        self.cmd_sn = opts.cmd_sn;
        let mut first = vec![kv("InitiatorName", &opts.initiator)];
        match &opts.target {
            Some(t) => {
                first.push(kv("SessionType", "Normal"));
                first.push(kv("TargetName", t));
            }
            None => first.push(kv("SessionType", "Discovery")),
        }
        let value = |pairs: &[(String, String)], key: &str| {
            pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
        };
        match &opts.chap {
            None => {
                first.push(kv("AuthMethod", "None"));
                let (resp, _) = self.login_pdu(opts, 0, true, 1, &first)?;
                if !resp.transit {
                    return Err(LoginError::Other(
                        "target did not allow T=1 to stage 1".into(),
                    ));
                }
            }
            Some(chap) => {
                first.push(kv("AuthMethod", "CHAP"));
                let (_, pairs) = self.login_pdu(opts, 0, false, 0, &first)?;
                if value(&pairs, "AuthMethod").as_deref() != Some("CHAP") {
                    return Err(LoginError::Other(format!("AuthMethod answer {pairs:?}")));
                }
                let (_, pairs) =
                    self.login_pdu(opts, 0, false, 0, &[kv("CHAP_A", chap.algorithm)])?;
                let alg: u8 = value(&pairs, "CHAP_A")
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| LoginError::Other(format!("no CHAP_A in {pairs:?}")))?;
                if alg != chap.algorithm {
                    return Err(LoginError::Other(format!("CHAP_A {alg} chosen")));
                }
                let algorithm = ChapAlgorithm::from_code(alg).unwrap();
                let id: u8 = value(&pairs, "CHAP_I")
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| LoginError::Other("no CHAP_I".into()))?;
                let challenge = value(&pairs, "CHAP_C")
                    .and_then(|v| text::decode_binary(&v).ok())
                    .ok_or_else(|| LoginError::Other("no CHAP_C".into()))?;
                let response = algorithm.response(id, &chap.secret, &challenge);
                let mut keys = vec![
                    kv("CHAP_N", &chap.user),
                    kv("CHAP_R", text::encode_hex(&response)),
                ];
                let my_id = 0x5au8;
                let my_challenge = pattern(u64::from(alg) + 77, 32);
                if chap.mutual.is_some() {
                    keys.push(kv("CHAP_I", my_id));
                    keys.push(kv("CHAP_C", text::encode_hex(&my_challenge)));
                }
                let (resp, pairs) = self.login_pdu(opts, 0, true, 1, &keys)?;
                if let Some((user, secret)) = &chap.mutual {
                    let name = value(&pairs, "CHAP_N");
                    let r = value(&pairs, "CHAP_R").and_then(|v| text::decode_binary(&v).ok());
                    let expected = algorithm.response(my_id, secret, &my_challenge);
                    if name.as_deref() != Some(user.as_str()) || r.as_deref() != Some(&expected[..])
                    {
                        return Err(LoginError::Other(format!(
                            "target failed mutual CHAP: {name:?}"
                        )));
                    }
                }
                if !resp.transit {
                    return Err(LoginError::Other(
                        "target did not leave security stage".into(),
                    ));
                }
            }
        }
        let yn = |b: bool| if b { "Yes" } else { "No" };
        let digest = |b: bool| if b { "CRC32C" } else { "None" };
        let mut op = vec![
            kv("HeaderDigest", digest(opts.header_digest)),
            kv("DataDigest", digest(opts.data_digest)),
            kv("MaxRecvDataSegmentLength", opts.max_recv),
        ];
        if opts.tsih == 0 {
            op.push(kv("ErrorRecoveryLevel", 0));
            if opts.target.is_some() {
                op.push(kv("InitialR2T", yn(opts.initial_r2t)));
                op.push(kv("ImmediateData", yn(opts.immediate_data)));
                op.push(kv("FirstBurstLength", opts.first_burst));
                op.push(kv("MaxBurstLength", opts.max_burst));
                op.push(kv("MaxConnections", opts.max_connections));
            }
        }
        let mut keys = op;
        let mut final_resp = None;
        for _ in 0..4 {
            let (resp, _) = self.login_pdu(opts, 1, true, 3, &keys)?;
            keys = Vec::new();
            if resp.transit && resp.nsg == 3 {
                final_resp = Some(resp);
                break;
            }
        }
        let resp =
            final_resp.ok_or_else(|| LoginError::Other("target never went to FFP".into()))?;
        self.tsih = resp.tsih;
        self.negotiated.tsih = resp.tsih;
        self.negotiated.tpgt = self
            .negotiated
            .keys
            .get("TargetPortalGroupTag")
            .and_then(|v| v.parse().ok());
        let k = &self.negotiated.keys;
        let hd = k
            .get("HeaderDigest")
            .map(|v| v == "CRC32C")
            .unwrap_or(false);
        let dd = k.get("DataDigest").map(|v| v == "CRC32C").unwrap_or(false);
        self.max_xmit = k
            .get("MaxRecvDataSegmentLength")
            .and_then(|v| v.parse().ok())
            .unwrap_or(8192);
        let yes = |key: &str, default: bool| k.get(key).map(|v| v == "Yes").unwrap_or(default);
        self.immediate_data = yes("ImmediateData", true);
        self.initial_r2t = yes("InitialR2T", true);
        self.first_burst = k
            .get("FirstBurstLength")
            .and_then(|v| v.parse().ok())
            .unwrap_or(65536);
        self.max_burst = k
            .get("MaxBurstLength")
            .and_then(|v| v.parse().ok())
            .unwrap_or(262144);
        self.framer = Framer {
            header_digest: hd,
            data_digest: dd,
            max_recv_data_segment_length: opts.max_recv as usize,
        };
        Ok(self.negotiated.clone())
    }

    // ---- full-feature requests ----

    /// Sends a SCSI command with the next CmdSN and runs it to completion.
    pub fn scsi(
        &mut self,
        cdb: &[u8],
        edtl: u32,
        write: Option<&[u8]>,
    ) -> Result<ScsiResult, String> {
        let cmd_sn = self.cmd_sn;
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        let itt = self.itt();
        self.send_scsi(itt, cmd_sn, 0, cdb, edtl, write);
        self.complete_scsi(itt, write)
    }

    /// Sends the command PDU (with immediate data and unsolicited Data-Out as negotiated).
    pub fn send_scsi(
        &mut self,
        itt: u32,
        cmd_sn: u32,
        lun: u64,
        cdb: &[u8],
        edtl: u32,
        write: Option<&[u8]>,
    ) {
        let mut c16 = [0u8; 16];
        c16[..cdb.len()].copy_from_slice(cdb);
        let data = write.unwrap_or_default();
        let unsolicited_max = if write.is_some() && !self.initial_r2t {
            self.first_burst.min(edtl) as usize
        } else {
            0
        };
        let imm_len = if write.is_some() && self.immediate_data {
            data.len()
                .min(self.max_xmit)
                .min(self.first_burst as usize)
                .min(edtl as usize)
        } else {
            0
        };
        let unsolicited_end = unsolicited_max.max(imm_len).min(data.len());
        let cmd = Pdu::ScsiCommand(ScsiCommand {
            immediate: false,
            final_bit: unsolicited_end <= imm_len,
            read: write.is_none() && edtl > 0,
            write: write.is_some(),
            attr: task_attr::SIMPLE,
            lun,
            itt,
            expected_data_length: edtl,
            cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: c16,
            extended_cdb: None,
            bidi_read_length: None,
            data: Bytes::copy_from_slice(&data[..imm_len]),
        });
        self.send(&cmd);
        if unsolicited_end > imm_len {
            self.send_data_out(
                itt,
                lun,
                RESERVED_TAG,
                data,
                imm_len,
                unsolicited_end - imm_len,
            );
        }
    }

    /// Sends `len` bytes of `data` from `offset` as a Data-Out sequence.
    pub fn send_data_out(
        &mut self,
        itt: u32,
        lun: u64,
        ttt: u32,
        data: &[u8],
        offset: usize,
        len: usize,
    ) {
        let end = offset + len;
        let mut off = offset;
        let mut data_sn = 0;
        while off < end {
            let n = (end - off).min(self.max_xmit);
            let pdu = Pdu::DataOut(DataOut {
                final_bit: off + n == end,
                lun,
                itt,
                ttt,
                exp_stat_sn: self.exp_stat_sn,
                data_sn,
                buffer_offset: off as u32,
                data: Bytes::copy_from_slice(&data[off..off + n]),
            });
            self.send(&pdu);
            data_sn += 1;
            off += n;
        }
    }

    /// Waits for the command's status, answering R2Ts and collecting Data-In.
    pub fn complete_scsi(&mut self, itt: u32, write: Option<&[u8]>) -> Result<ScsiResult, String> {
        let mut res = ScsiResult::default();
        let mut other = Vec::new();
        let out = loop {
            let p = match self.recv() {
                Ok(p) => p,
                Err(e) => break Err(format!("waiting for ITT {itt:#x}: {e}")),
            };
            match p {
                Pdu::DataIn(d) if d.itt == itt => {
                    res.data_in_pdus += 1;
                    let end = d.buffer_offset as usize + d.data.len();
                    if res.data.len() < end {
                        res.data.resize(end, 0);
                    }
                    res.data[d.buffer_offset as usize..end].copy_from_slice(&d.data);
                    if d.status_present {
                        res.status = d.status;
                        res.overflow = d.overflow;
                        res.underflow = d.underflow;
                        res.residual = d.residual;
                        break Ok(res);
                    }
                }
                Pdu::R2t(r) if r.itt == itt => {
                    res.r2ts += 1;
                    let data = write.ok_or("R2T for a command without data")?;
                    let off = r.buffer_offset as usize;
                    let len = (r.desired_length as usize).min(data.len().saturating_sub(off));
                    self.send_data_out(itt, r.lun, r.ttt, data, off, len);
                }
                Pdu::ScsiResponse(r) if r.itt == itt => {
                    res.status = r.status;
                    res.response = r.response;
                    res.overflow = r.overflow;
                    res.underflow = r.underflow;
                    res.residual = r.residual;
                    if r.data.len() >= 2 {
                        let n = usize::from(u16::from_be_bytes([r.data[0], r.data[1]]));
                        res.sense = r.data[2..(2 + n).min(r.data.len())].to_vec();
                    }
                    break Ok(res);
                }
                Pdu::Reject(r) => break Err(format!("Reject reason {:#x}", r.reason)),
                p => other.push(p),
            }
        };
        for p in other {
            self.unread(p);
        }
        out
    }

    pub fn write10(&mut self, lba: u32, data: &[u8]) -> ScsiResult {
        self.write10_flags(lba, data, 0)
    }

    pub fn write10_flags(&mut self, lba: u32, data: &[u8], byte1: u8) -> ScsiResult {
        let r = self
            .scsi(
                &cdb_write10(lba, (data.len() / 512) as u16, byte1),
                data.len() as u32,
                Some(data),
            )
            .unwrap_or_else(|e| panic!("WRITE(10) lba {lba}: {e}"));
        assert_eq!(
            r.status,
            0,
            "WRITE(10) lba {lba} status, sense {:?}",
            r.sense_triplet()
        );
        r
    }

    pub fn read10(&mut self, lba: u32, blocks: u16) -> Vec<u8> {
        let r = self
            .scsi(&cdb_read10(lba, blocks), u32::from(blocks) * 512, None)
            .unwrap_or_else(|e| panic!("READ(10) lba {lba}: {e}"));
        assert_eq!(
            r.status,
            0,
            "READ(10) lba {lba} status, sense {:?}",
            r.sense_triplet()
        );
        r.data
    }

    /// TEST UNIT READY; returns (status, sense triplet).
    pub fn tur(&mut self) -> (u8, Option<(u8, u8, u8)>) {
        let r = self.scsi(&[0u8; 6], 0, None).expect("TEST UNIT READY");
        (r.status, r.sense_triplet())
    }

    /// Immediate NOP-Out ping; returns the echoed data.
    pub fn ping(&mut self, data: &[u8]) -> Result<Bytes, String> {
        let itt = self.itt();
        self.try_send(&Pdu::NopOut(NopOut {
            immediate: true,
            lun: 0,
            itt,
            ttt: RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            data: Bytes::copy_from_slice(data),
        }))
        .map_err(|e| e.to_string())?;
        self.wait_for(|p| matches!(p, Pdu::NopIn(n) if n.itt == itt))
            .map(|p| p.data().clone())
    }

    /// Waits for a PDU matching `want`; others are kept for later `recv`s.
    pub fn wait_for(&mut self, want: impl Fn(&Pdu) -> bool) -> Result<Pdu, String> {
        let mut other = Vec::new();
        let r = loop {
            match self.recv() {
                Ok(p) if want(&p) => break Ok(p),
                Ok(p) => other.push(p),
                Err(e) => break Err(format!("{e}; seen {other:?}")),
            }
        };
        for p in other {
            self.unread(p);
        }
        r
    }

    /// Task management request (immediate); returns the response code.
    pub fn tmf(&mut self, function: u8, lun: u64, rtt: u32, ref_cmd_sn: u32) -> u8 {
        let itt = self.itt();
        self.send(&Pdu::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function: function | 0x80,
            lun,
            itt,
            referenced_task_tag: rtt,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            ref_cmd_sn,
            exp_data_sn: 0,
        }));
        match self.wait_for(|p| matches!(p, Pdu::TaskMgmtResponse(r) if r.itt == itt)) {
            Ok(Pdu::TaskMgmtResponse(r)) => r.response,
            other => panic!("TMF {function}: {other:?}"),
        }
    }

    /// A whole text exchange (following C-bit continuations); returns the collected text.
    pub fn text(&mut self, data: &[u8]) -> Vec<(String, String)> {
        let itt = self.itt();
        let mut ttt = RESERVED_TAG;
        let mut body = data.to_vec();
        let mut all = Vec::new();
        loop {
            let cmd_sn = self.cmd_sn;
            self.cmd_sn = self.cmd_sn.wrapping_add(1);
            self.send(&Pdu::TextRequest(TextRequest {
                immediate: false,
                final_bit: true,
                continue_bit: false,
                lun: 0,
                itt,
                ttt,
                cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
                data: Bytes::from(std::mem::take(&mut body)),
            }));
            let r = match self.wait_for(|p| matches!(p, Pdu::TextResponse(r) if r.itt == itt)) {
                Ok(Pdu::TextResponse(r)) => r,
                other => panic!("text: {other:?}"),
            };
            all.extend_from_slice(&r.data);
            if r.final_bit {
                break;
            }
            ttt = r.ttt;
        }
        text::parse_allow_repeats(&all)
            .expect("text answer parses")
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Logout with `reason` (0 session, 1 connection `cid`); returns the response code.
    pub fn logout(&mut self, reason: u8, cid: u16) -> u8 {
        let itt = self.itt();
        let cmd_sn = self.cmd_sn;
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.send(&Pdu::LogoutRequest(LogoutRequest {
            immediate: false,
            reason,
            itt,
            cid,
            cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        }));
        match self.wait_for(|p| matches!(p, Pdu::LogoutResponse(r) if r.itt == itt)) {
            Ok(Pdu::LogoutResponse(r)) => r.response,
            other => panic!("logout: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CDBs
// ---------------------------------------------------------------------------------------------

pub fn cdb_read10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x28;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// WRITE(10); `byte1` carries flags such as FUA (0x08).
pub fn cdb_write10(lba: u32, blocks: u16, byte1: u8) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x2a;
    c[1] = byte1;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn cdb_sync_cache10() -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x35;
    c
}

/// MODE SENSE(10) of one page (current values).
pub fn cdb_mode_sense10(page: u8, alloc: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x5a;
    c[1] = 0x08; // DBD
    c[2] = page & 0x3f;
    c[7..9].copy_from_slice(&alloc.to_be_bytes());
    c
}

pub fn cdb_mode_select10(len: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x55;
    c[1] = 0x10; // PF
    c[7..9].copy_from_slice(&len.to_be_bytes());
    c
}
