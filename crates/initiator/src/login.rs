//! Sans-IO initiator side of the iSCSI login (RFC 7143 6.3): security stage with
//! AuthMethod=None or one-way CHAP, then operational negotiation, then full feature phase.
//!
//! ```text
//!  new() --request--> Security --(None, T=1)---------------------------+
//!                        | AuthMethod=CHAP agreed                      |
//!                        v                                             v
//!                  ChapAlgorithm --CHAP_A/I/C--> ChapResponse --T=1--> Operational --T=1,NSG=3--> Complete
//! ```
//! Each `handle` consumes one Login Response and yields the next request, the negotiated
//! parameters, or an error. No I/O, no clock: the driver owns the socket and the timeouts.

use bytes::Bytes;
use iscsi_proto::chap::ChapAlgorithm;
use iscsi_proto::pdu::{LoginRequest, LoginResponse};
use iscsi_proto::text;
use std::collections::HashMap;

use crate::Error;

/// Stage numbers (RFC 7143 11.12.3).
const SECURITY: u8 = 0;
const OPERATIONAL: u8 = 1;
const FULL_FEATURE: u8 = 3;

/// One-way CHAP credentials of the initiator.
#[derive(Clone)]
pub struct ChapSecret {
    pub user: String,
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for ChapSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapSecret")
            .field("user", &self.user)
            .finish()
    }
}

/// What we ask for in the operational stage.
#[derive(Debug, Clone)]
pub struct Offer {
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub max_outstanding_r2t: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    /// MaxConnections: more than 1 for a multi-connection session (MC/S).
    pub max_connections: u32,
}

impl Default for Offer {
    fn default() -> Self {
        Offer {
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1 << 20,
            first_burst_length: 256 << 10,
            max_outstanding_r2t: 4,
            immediate_data: true,
            initial_r2t: false,
            max_connections: 1,
        }
    }
}

/// Who logs in to what.
#[derive(Debug, Clone)]
pub struct LoginParams {
    pub initiator_name: String,
    /// None: a discovery session.
    pub target: Option<String>,
    pub isid: [u8; 6],
    /// 0 for a new session (leading login); the session's TSIH to add a connection to it.
    pub tsih: u16,
    pub cid: u16,
    pub cmd_sn: u32,
    pub chap: Option<ChapSecret>,
    pub offer: Offer,
}

/// Parameters in force after the login, as the target answered them (RFC 7143 13).
#[derive(Debug, Clone)]
pub struct Negotiated {
    pub tsih: u16,
    pub tpgt: Option<u16>,
    /// The target's MaxRecvDataSegmentLength: the largest data segment we may send.
    pub max_send_data_segment_length: u32,
    /// Our MaxRecvDataSegmentLength.
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub max_outstanding_r2t: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    /// CmdSN, ExpStatSN, ExpCmdSN and MaxCmdSN after the last Login Response.
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub max_cmd_sn: u32,
    /// Every key the target sent.
    pub keys: HashMap<String, String>,
}

/// Where the login is.
#[derive(Debug)]
enum State {
    /// First request sent (AuthMethod offered).
    Security {
        chap: bool,
    },
    /// CHAP_A sent; waiting for CHAP_A/CHAP_I/CHAP_C.
    ChapAlgorithm(ChapSecret),
    /// CHAP_N/CHAP_R sent with T=1 to the operational stage.
    ChapResponse,
    /// Operational keys sent (the count bounds a target that never agrees).
    Operational {
        rounds: u8,
    },
    Complete,
}

/// The next thing the driver does.
#[derive(Debug)]
pub enum Step {
    Send(LoginRequest),
    Complete(Box<Negotiated>),
}

/// The initiator's login state machine.
#[derive(Debug)]
pub struct InitiatorLogin {
    params: LoginParams,
    state: State,
    exp_stat_sn: u32,
    tsih: u16,
    keys: HashMap<String, String>,
}

fn protocol(msg: impl Into<String>) -> Error {
    Error::Protocol(msg.into())
}

/// Keys this initiator offers in the operational stage: the target's values for them are
/// answers, never proposals.
const OFFERED: [&str; 10] = [
    "HeaderDigest",
    "DataDigest",
    "MaxRecvDataSegmentLength",
    "ErrorRecoveryLevel",
    "InitialR2T",
    "ImmediateData",
    "FirstBurstLength",
    "MaxBurstLength",
    "MaxOutstandingR2T",
    "MaxConnections",
];

/// Keys a target declares (RFC 7143 13): nothing to answer.
const DECLARED_BY_TARGET: [&str; 4] = [
    "TargetAlias",
    "TargetAddress",
    "TargetPortalGroupTag",
    "TargetSessionHandle",
];

/// Our answers to the keys a target proposed on its own (RFC 7143 6.2): the value it proposed
/// wherever this initiator works with it, `No` for markers (which it does not implement),
/// `0` for a higher ErrorRecoveryLevel, `NotUnderstood` for keys it does not know.
fn answer_proposals(pairs: &[(&str, &str)]) -> Bytes {
    let mut b = text::TextBuilder::new();
    for (key, value) in pairs {
        if OFFERED.contains(key) || DECLARED_BY_TARGET.contains(key) {
            continue;
        }
        match *key {
            // Both of these keep the target's value: this initiator sends in order anyway and
            // waits/retains as told.
            "DataPDUInOrder"
            | "DataSequenceInOrder"
            | "DefaultTime2Wait"
            | "DefaultTime2Retain" => {
                b.push(key, value);
            }
            "IFMarker" | "OFMarker" => {
                b.push(key, "No");
            }
            "IFMarkInt" | "OFMarkInt" => {
                b.push(key, "Irrelevant");
            }
            "ErrorRecoveryLevel" => {
                b.push(key, "0");
            }
            _ if *value == text::REJECT || *value == "NotUnderstood" || *value == "Irrelevant" => {}
            _ => {
                b.push(key, "NotUnderstood");
            }
        }
    }
    b.finish()
}

impl InitiatorLogin {
    /// Starts a login; returns the machine and the first Login Request.
    pub fn new(params: LoginParams) -> (InitiatorLogin, LoginRequest) {
        let mut b = text::TextBuilder::new();
        b.push("InitiatorName", &params.initiator_name);
        match &params.target {
            Some(t) => {
                b.push("SessionType", "Normal");
                b.push("TargetName", t);
            }
            None => {
                b.push("SessionType", "Discovery");
            }
        }
        let chap = params.chap.is_some();
        b.push("AuthMethod", if chap { "CHAP" } else { text::NONE });
        let tsih = params.tsih;
        let me = InitiatorLogin {
            params,
            state: State::Security { chap },
            exp_stat_sn: 0,
            tsih,
            keys: HashMap::new(),
        };
        // With AuthMethod=None we ask to leave the security stage at once.
        let req = if chap {
            me.request(SECURITY, None, b.finish())
        } else {
            me.request(SECURITY, Some(OPERATIONAL), b.finish())
        };
        (me, req)
    }

    fn request(&self, csg: u8, next: Option<u8>, data: Bytes) -> LoginRequest {
        LoginRequest {
            transit: next.is_some(),
            continue_bit: false,
            csg,
            nsg: next.unwrap_or(0),
            version_max: 0,
            version_min: 0,
            isid: self.params.isid,
            tsih: self.tsih,
            itt: 0x4c47_0000 | u32::from(self.params.cid),
            cid: self.params.cid,
            cmd_sn: self.params.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            data,
        }
    }

    fn operational_request(&self) -> LoginRequest {
        let o = &self.params.offer;
        let yn = text::format_bool;
        let mut b = text::TextBuilder::new();
        b.push("HeaderDigest", text::NONE);
        b.push("DataDigest", text::NONE);
        b.push_number(
            "MaxRecvDataSegmentLength",
            u64::from(o.max_recv_data_segment_length),
        );
        // Leading-only keys (RFC 7143 13) belong to the session's first connection alone.
        let leading = self.params.tsih == 0;
        if leading {
            b.push_number("ErrorRecoveryLevel", 0);
        }
        if self.params.target.is_some() && leading {
            b.push("InitialR2T", yn(o.initial_r2t));
            b.push("ImmediateData", yn(o.immediate_data));
            b.push_number("FirstBurstLength", u64::from(o.first_burst_length));
            b.push_number("MaxBurstLength", u64::from(o.max_burst_length));
            b.push_number("MaxOutstandingR2T", u64::from(o.max_outstanding_r2t));
            b.push_number("MaxConnections", u64::from(o.max_connections.max(1)));
        }
        self.request(OPERATIONAL, Some(FULL_FEATURE), b.finish())
    }

    /// Consumes one Login Response.
    pub fn handle(&mut self, resp: &LoginResponse) -> Result<Step, Error> {
        if resp.status_class != 0 {
            return Err(Error::LoginRefused {
                class: resp.status_class,
                detail: resp.status_detail,
            });
        }
        if resp.continue_bit {
            // Our requests are small; a target needing continuation is beyond this slice.
            return Err(protocol("continued login text is not supported"));
        }
        self.exp_stat_sn = resp.stat_sn.wrapping_add(1);
        self.tsih = resp.tsih;
        let pairs = text::parse_allow_repeats(&resp.data)
            .map_err(|e| protocol(format!("bad login text: {e}")))?;
        let get = |k: &str| pairs.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
        for (k, v) in &pairs {
            if *v == text::REJECT && k.starts_with("CHAP") {
                return Err(protocol(format!("target rejected {k}")));
            }
        }
        let state = std::mem::replace(&mut self.state, State::Complete);
        let (next, step) = match state {
            State::Security { chap: false } => {
                if get("AuthMethod").is_some_and(|v| v != text::NONE) {
                    return Err(protocol("target requires authentication (AuthMethod=CHAP)"));
                }
                if !resp.transit {
                    return Err(protocol("target stayed in the security stage"));
                }
                self.after_security(resp)?
            }
            State::Security { chap: true } => {
                if get("AuthMethod") != Some("CHAP") {
                    return Err(protocol(format!(
                        "target did not agree to CHAP (AuthMethod={})",
                        get("AuthMethod").unwrap_or("missing")
                    )));
                }
                let secret = self
                    .params
                    .chap
                    .clone()
                    .ok_or_else(|| protocol("internal: CHAP state without credentials"))?;
                let mut b = text::TextBuilder::new();
                b.push("CHAP_A", "7,6,5,8");
                let req = self.request(SECURITY, None, b.finish());
                (State::ChapAlgorithm(secret), Step::Send(req))
            }
            State::ChapAlgorithm(secret) => {
                let code = get("CHAP_A")
                    .and_then(|v| v.parse::<u8>().ok())
                    .ok_or_else(|| protocol("no CHAP_A in the target's challenge"))?;
                let algorithm = ChapAlgorithm::from_code(code)
                    .ok_or_else(|| protocol(format!("target chose unknown CHAP_A={code}")))?;
                let id = get("CHAP_I")
                    .and_then(|v| v.parse::<u8>().ok())
                    .ok_or_else(|| protocol("missing or bad CHAP_I"))?;
                let challenge = get("CHAP_C")
                    .and_then(|v| text::decode_binary(v).ok())
                    .ok_or_else(|| protocol("missing or bad CHAP_C"))?;
                let response = algorithm.response(id, &secret.secret, &challenge);
                let mut b = text::TextBuilder::new();
                b.push("CHAP_N", &secret.user);
                b.push("CHAP_R", &text::encode_hex(&response));
                let req = self.request(SECURITY, Some(OPERATIONAL), b.finish());
                (State::ChapResponse, Step::Send(req))
            }
            State::ChapResponse => {
                if !resp.transit {
                    return Err(protocol(
                        "target did not leave the security stage after CHAP",
                    ));
                }
                self.after_security(resp)?
            }
            State::Operational { rounds } => {
                self.remember(&pairs);
                if resp.transit && resp.nsg == FULL_FEATURE {
                    (
                        State::Complete,
                        Step::Complete(Box::new(self.negotiated(resp)?)),
                    )
                } else if rounds >= 4 {
                    return Err(protocol("target never agreed to the full feature phase"));
                } else {
                    // A target may propose keys of its own and wait for our answers before it
                    // transits (LIO proposes DefaultTime2Wait, IFMarker, ... with T=0).
                    let answers = answer_proposals(&pairs);
                    let req = self.request(OPERATIONAL, Some(FULL_FEATURE), answers);
                    (State::Operational { rounds: rounds + 1 }, Step::Send(req))
                }
            }
            State::Complete => return Err(protocol("Login Response after the login completed")),
        };
        self.remember(&pairs);
        self.state = next;
        Ok(step)
    }

    fn remember(&mut self, pairs: &[(&str, &str)]) {
        for (k, v) in pairs {
            if !k.starts_with("CHAP_") {
                self.keys.insert((*k).to_string(), (*v).to_string());
            }
        }
    }

    fn after_security(&mut self, resp: &LoginResponse) -> Result<(State, Step), Error> {
        match resp.nsg {
            OPERATIONAL => Ok((
                State::Operational { rounds: 0 },
                Step::Send(self.operational_request()),
            )),
            // The target may skip the operational stage: every key keeps its default.
            FULL_FEATURE => Ok((
                State::Complete,
                Step::Complete(Box::new(self.negotiated(resp)?)),
            )),
            n => Err(protocol(format!("target moved to unknown stage {n}"))),
        }
    }

    fn negotiated(&self, resp: &LoginResponse) -> Result<Negotiated, Error> {
        let k = &self.keys;
        let number = |key: &str, default: u32| -> Result<u32, Error> {
            match k.get(key) {
                None => Ok(default),
                Some(v) => text::parse_number(v)
                    .ok()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n > 0)
                    .ok_or_else(|| protocol(format!("bad {key}={v}"))),
            }
        };
        let boolean = |key: &str, default: bool| -> Result<bool, Error> {
            match k.get(key) {
                None => Ok(default),
                Some(v) => text::parse_bool(v).map_err(|_| protocol(format!("bad {key}={v}"))),
            }
        };
        for digest in ["HeaderDigest", "DataDigest"] {
            if let Some(v) = k.get(digest).filter(|v| *v != text::NONE) {
                return Err(protocol(format!("target chose {digest}={v}")));
            }
        }
        let o = &self.params.offer;
        // Defaults per RFC 7143 13; MaxRecvDataSegmentLength declared by the target, 8192 if not.
        Ok(Negotiated {
            tsih: resp.tsih,
            tpgt: k.get("TargetPortalGroupTag").and_then(|v| v.parse().ok()),
            max_send_data_segment_length: number("MaxRecvDataSegmentLength", 8192)?,
            max_recv_data_segment_length: o.max_recv_data_segment_length,
            max_burst_length: number("MaxBurstLength", 262_144)?,
            first_burst_length: number("FirstBurstLength", 65_536)?,
            max_outstanding_r2t: number("MaxOutstandingR2T", 1)?,
            immediate_data: boolean("ImmediateData", true)?,
            initial_r2t: boolean("InitialR2T", true)?,
            cmd_sn: self.params.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            max_cmd_sn: resp.max_cmd_sn,
            keys: k.clone(),
        })
    }
}

#[cfg(test)]
#[path = "login_tests.rs"]
mod tests;
