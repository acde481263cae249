//! `TargetLogin`: the login state machine of one connection (see the diagram in `login`).

use super::security::{AuthState, Failure};
use super::{LoginOutcome, LoginPolicy, LoginRefusal, LoginStep};
use crate::negotiation::{
    classify, KeyClass, NegotiationError, Negotiator, Phase, SessionType, TargetDefaults,
};
use crate::pdu::{stage, LoginRequest, LoginResponse};
use crate::text::{self, TextBuilder};
use bytes::{Bytes, BytesMut};

/// Most Login Requests one login may take (C-bit pieces included); real logins use 2-6.
pub const MAX_LOGIN_PDUS: usize = 16;
/// Most key text accumulated over C-bit continuations (RFC 7143 6.1 requires at least 8192).
pub const MAX_LOGIN_TEXT: usize = 64 * 1024;

/// The header fields that must not change across the PDUs of one login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
    itt: u32,
    version_max: u8,
    version_min: u8,
}

impl Identity {
    fn of(req: &LoginRequest) -> Self {
        Identity {
            isid: req.isid,
            tsih: req.tsih,
            cid: req.cid,
            itt: req.itt,
            version_max: req.version_max,
            version_min: req.version_min,
        }
    }
}

/// Data every stage carries.
#[derive(Debug)]
struct Context {
    negotiator: Negotiator,
    /// Key text of a request still arriving in C=1 pieces, and the CSG it arrives in.
    pending: BytesMut,
    pending_csg: Option<u8>,
    authenticated_user: Option<String>,
}

#[derive(Debug)]
enum State {
    Initial,
    /// The first request's text is still arriving (C=1): nothing is known yet.
    FirstText(Box<Context>),
    SecurityNegotiation(Box<Context>, AuthState),
    OperationalNegotiation(Box<Context>),
    Done,
    Failed(LoginRefusal, String),
}

/// Where a complete request is processed.
enum Stage {
    First,
    Security(AuthState),
    Operational,
}

/// The target side of one connection's login. Feed each Login Request to [`handle`] and send
/// what it returns.
///
/// [`handle`]: TargetLogin::handle
#[derive(Debug)]
pub struct TargetLogin {
    defaults: TargetDefaults,
    state: State,
    identity: Option<Identity>,
    pdus: usize,
    /// StatSN of the next response (RFC 7143 11.13.4: starts at the initiator's ExpStatSN and
    /// counts every Login Response).
    stat_sn: u32,
    exp_cmd_sn: u32,
    tpgt_sent: bool,
    /// InitiatorName once declared, kept after the login ends so a failure can be logged
    /// with it.
    initiator: String,
}

fn negotiation_failure(e: NegotiationError) -> Failure {
    let refusal = match e {
        NegotiationError::SessionTypeNotSupported(_) => LoginRefusal::SessionTypeNotSupported,
        _ => LoginRefusal::InitiatorError,
    };
    Failure::new(refusal, e.to_string())
}

impl TargetLogin {
    pub fn new(defaults: TargetDefaults) -> Self {
        TargetLogin {
            defaults,
            state: State::Initial,
            identity: None,
            pdus: 0,
            stat_sn: 0,
            exp_cmd_sn: 0,
            tpgt_sent: false,
            initiator: String::new(),
        }
    }

    /// Feeds one Login Request; returns what to send.
    pub fn handle(&mut self, req: &LoginRequest, policy: &mut impl LoginPolicy) -> LoginStep {
        let state = std::mem::replace(&mut self.state, State::Done);
        match self.advance(state, req, policy) {
            Ok((state, step)) => {
                self.state = state;
                step
            }
            Err(Failure { refusal, reason }) => {
                let (class, detail) = refusal.status();
                let mut resp = self.response(req, false, 0, Bytes::new());
                resp.status_class = class;
                resp.status_detail = detail;
                self.state = State::Failed(refusal, reason);
                LoginStep::Failed(resp, refusal)
            }
        }
    }

    /// Why the login failed, for the log line (None unless it has failed).
    pub fn failure_reason(&self) -> Option<&str> {
        match &self.state {
            State::Failed(_, reason) => Some(reason),
            _ => None,
        }
    }

    /// The refusal the login ended with, if it failed.
    pub fn refusal(&self) -> Option<LoginRefusal> {
        match &self.state {
            State::Failed(refusal, _) => Some(*refusal),
            _ => None,
        }
    }

    /// True once the final response has been produced.
    pub fn is_complete(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// The InitiatorName declared so far (empty before the first complete request).
    pub fn initiator_name(&self) -> &str {
        match &self.state {
            State::FirstText(ctx)
            | State::SecurityNegotiation(ctx, _)
            | State::OperationalNegotiation(ctx) => &ctx.negotiator.session().initiator_name,
            _ => &self.initiator,
        }
    }

    /// A response to `req` carrying the next StatSN.
    fn response(
        &mut self,
        req: &LoginRequest,
        transit: bool,
        nsg: u8,
        data: Bytes,
    ) -> LoginResponse {
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        let exp_cmd_sn = self.exp_cmd_sn;
        LoginResponse {
            transit,
            continue_bit: false,
            csg: req.csg,
            nsg: if transit { nsg } else { 0 },
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih: req.tsih,
            itt: req.itt,
            stat_sn,
            exp_cmd_sn,
            // Login requests are immediate and take no CmdSN slot; the window opens at
            // ExpCmdSN (RFC 7143 11.13: MaxCmdSN = ExpCmdSN - 1 + window).
            max_cmd_sn: exp_cmd_sn
                .wrapping_add(self.defaults.queue_depth.max(1))
                .wrapping_sub(1),
            status_class: 0,
            status_detail: 0,
            data,
        }
    }

    /// Header checks for every request (RFC 7143 11.12).
    fn check_header(&mut self, req: &LoginRequest) -> Result<(), Failure> {
        self.pdus += 1;
        if self.pdus > MAX_LOGIN_PDUS {
            return Err(Failure::new(
                LoginRefusal::InitiatorError,
                "too many login PDUs",
            ));
        }
        let ids = Identity::of(req);
        match self.identity {
            None => {
                self.identity = Some(ids);
                self.stat_sn = req.exp_stat_sn;
                self.exp_cmd_sn = req.cmd_sn;
                // RFC 7143 11.12.4/11.12.5: the range Version-min..=Version-max must include
                // version 0x00, the only one defined; otherwise 0x0205.
                if req.version_min != 0 {
                    return Err(Failure::new(
                        LoginRefusal::UnsupportedVersion,
                        format!("versions {}..={}", req.version_min, req.version_max),
                    ));
                }
            }
            Some(first) if first != ids => {
                // RFC 7143 11.12: ISID, TSIH, CID, ITT and the versions stay the same within
                // one login.
                return Err(Failure::new(
                    LoginRefusal::InitiatorError,
                    "ISID/TSIH/CID/ITT/version changed during login",
                ));
            }
            Some(_) => {}
        }
        // RFC 7143 11.12.2: "If the C bit is set to 1, the T bit MUST be 0".
        if req.transit && req.continue_bit {
            return Err(Failure::new(
                LoginRefusal::InitiatorError,
                "T and C both set",
            ));
        }
        let legal_csg = req.csg == stage::SECURITY_NEGOTIATION
            || req.csg == stage::LOGIN_OPERATIONAL_NEGOTIATION;
        // RFC 7143 11.12.3: NSG 2 is reserved; transitions go forward only (0->1, 0->3, 1->3).
        let legal_transit = !req.transit
            || (req.nsg > req.csg && req.nsg != 2 && req.nsg <= stage::FULL_FEATURE_PHASE);
        if !legal_csg || !legal_transit {
            return Err(Failure::new(
                LoginRefusal::InitiatorError,
                format!(
                    "illegal stage CSG={} NSG={} T={}",
                    req.csg, req.nsg, req.transit
                ),
            ));
        }
        Ok(())
    }

    fn advance(
        &mut self,
        state: State,
        req: &LoginRequest,
        policy: &mut impl LoginPolicy,
    ) -> Result<(State, LoginStep), Failure> {
        let (mut ctx, stage_now) = match state {
            State::Initial => {
                let leading = req.tsih == 0;
                let ctx = Context {
                    negotiator: Negotiator::new(self.defaults.clone(), leading),
                    pending: BytesMut::new(),
                    pending_csg: None,
                    authenticated_user: None,
                };
                (Box::new(ctx), Stage::First)
            }
            State::FirstText(ctx) => (ctx, Stage::First),
            State::SecurityNegotiation(ctx, auth) => (ctx, Stage::Security(auth)),
            State::OperationalNegotiation(ctx) => (ctx, Stage::Operational),
            State::Done | State::Failed(..) => {
                return Err(Failure::new(
                    LoginRefusal::InitiatorError,
                    "login already over",
                ))
            }
        };
        self.check_header(req)?;
        let expected_csg = match &stage_now {
            Stage::First => ctx.pending_csg.unwrap_or(req.csg),
            Stage::Security(_) => stage::SECURITY_NEGOTIATION,
            Stage::Operational => stage::LOGIN_OPERATIONAL_NEGOTIATION,
        };
        if req.csg != expected_csg {
            return Err(Failure::new(
                LoginRefusal::InitiatorError,
                format!("CSG {} in stage {expected_csg}", req.csg),
            ));
        }
        if ctx.pending.len() + req.data.len() > MAX_LOGIN_TEXT {
            return Err(Failure::new(
                LoginRefusal::OutOfResources,
                "login text too long",
            ));
        }
        ctx.pending.extend_from_slice(&req.data);
        if req.continue_bit {
            // RFC 7143 6.1/11.12.2: more text follows; answer with an empty response.
            ctx.pending_csg = Some(req.csg);
            let resp = self.response(req, false, 0, Bytes::new());
            let state = match stage_now {
                Stage::First => State::FirstText(ctx),
                Stage::Security(auth) => State::SecurityNegotiation(ctx, auth),
                Stage::Operational => State::OperationalNegotiation(ctx),
            };
            return Ok((state, LoginStep::Continue(resp)));
        }
        ctx.pending_csg = None;
        let text_bytes = ctx.pending.split().freeze();
        let pairs = text::parse(&text_bytes)
            .map_err(|e| Failure::new(LoginRefusal::InitiatorError, e.to_string()))?;
        let mut out = TextBuilder::new();
        ctx.negotiator
            .declare_identity(&pairs)
            .map_err(negotiation_failure)?;
        if self.initiator.is_empty() {
            self.initiator
                .clone_from(&ctx.negotiator.session().initiator_name);
        }
        let auth = match stage_now {
            Stage::First => {
                let credentials = self.authorize(&ctx, policy, &mut out)?;
                if req.csg == stage::SECURITY_NEGOTIATION {
                    Some(AuthState::AwaitAuthMethod { credentials })
                } else if credentials.is_some() {
                    // Skipping the security stage while CHAP is required.
                    return Err(Failure::new(
                        LoginRefusal::AuthenticationFailed,
                        "security stage skipped but CHAP required",
                    ));
                } else {
                    None
                }
            }
            Stage::Security(auth) => Some(auth),
            Stage::Operational => None,
        };
        match auth {
            Some(auth) => self.security(ctx, auth, req, &pairs, out, policy),
            None => self.operational(ctx, req, &pairs, out, policy),
        }
    }

    /// First complete request: check the declarations and ask the policy.
    fn authorize(
        &mut self,
        ctx: &Context,
        policy: &mut impl LoginPolicy,
        out: &mut TextBuilder,
    ) -> Result<Option<crate::chap::ChapCredentials>, Failure> {
        let session = ctx.negotiator.session();
        // RFC 7143 13.6: InitiatorName MUST be sent in the first Login Request of every
        // connection; 13.4: TargetName too, for a Normal session. Missing -> 0x0207.
        if session.initiator_name.is_empty() {
            return Err(Failure::new(
                LoginRefusal::MissingParameter,
                "no InitiatorName",
            ));
        }
        let credentials = match session.session_type {
            SessionType::Discovery => policy
                .discovery_auth(&session.initiator_name)
                .map_err(|r| Failure::new(r, "discovery login refused by policy"))?,
            SessionType::Normal => {
                let Some(target) = session.target_name.as_deref() else {
                    return Err(Failure::new(
                        LoginRefusal::MissingParameter,
                        "no TargetName",
                    ));
                };
                let creds = policy
                    .authorize(&session.initiator_name, target)
                    .map_err(|r| Failure::new(r, format!("login to {target} refused by policy")))?;
                if !self.tpgt_sent {
                    // RFC 7143 13.9: the target returns TargetPortalGroupTag in the first
                    // Login Response of a Normal session.
                    self.tpgt_sent = true;
                    out.push_number("TargetPortalGroupTag", u64::from(policy.portal_group_tag()));
                    if let Some(alias) = &self.defaults.target_alias {
                        out.push("TargetAlias", alias);
                    }
                }
                creds
            }
        };
        Ok(credentials)
    }

    fn security(
        &mut self,
        mut ctx: Box<Context>,
        auth: AuthState,
        req: &LoginRequest,
        pairs: &[(&str, &str)],
        mut out: TextBuilder,
        policy: &mut impl LoginPolicy,
    ) -> Result<(State, LoginStep), Failure> {
        let auth = auth.step(pairs, &mut |b| policy.fill_random(b), &mut out)?;
        ctx.negotiator
            .negotiate(Phase::SecurityNegotiation, pairs, &mut out)
            .map_err(negotiation_failure)?;
        let auth = if req.transit {
            auth.on_transit()?
        } else {
            auth
        };
        match auth {
            AuthState::Authenticated { user } if req.transit => {
                ctx.authenticated_user = user;
                if req.nsg == stage::FULL_FEATURE_PHASE {
                    return self.complete(ctx, req, out, policy);
                }
                let resp = self.response(req, true, req.nsg, out.finish());
                Ok((
                    State::OperationalNegotiation(ctx),
                    LoginStep::Continue(resp),
                ))
            }
            auth => {
                let resp = self.response(req, false, 0, out.finish());
                Ok((
                    State::SecurityNegotiation(ctx, auth),
                    LoginStep::Continue(resp),
                ))
            }
        }
    }

    fn operational(
        &mut self,
        mut ctx: Box<Context>,
        req: &LoginRequest,
        pairs: &[(&str, &str)],
        mut out: TextBuilder,
        policy: &mut impl LoginPolicy,
    ) -> Result<(State, LoginStep), Failure> {
        if let Some((key, _)) = pairs
            .iter()
            .find(|(k, _)| classify(k) == KeyClass::Security)
        {
            return Err(Failure::new(
                LoginRefusal::InitiatorError,
                format!("{key} in the operational stage"),
            ));
        }
        ctx.negotiator
            .negotiate(Phase::OperationalNegotiation, pairs, &mut out)
            .map_err(negotiation_failure)?;
        if req.transit {
            // check_header allowed only NSG=3 from CSG=1.
            return self.complete(ctx, req, out, policy);
        }
        let resp = self.response(req, false, 0, out.finish());
        Ok((
            State::OperationalNegotiation(ctx),
            LoginStep::Continue(resp),
        ))
    }

    /// Final response: the policy admits the connection and assigns the TSIH.
    fn complete(
        &mut self,
        ctx: Box<Context>,
        req: &LoginRequest,
        out: TextBuilder,
        policy: &mut impl LoginPolicy,
    ) -> Result<(State, LoginStep), Failure> {
        let Context {
            negotiator,
            authenticated_user,
            ..
        } = *ctx;
        let (session, connection) = negotiator.finish();
        let outcome = LoginOutcome {
            isid: req.isid,
            tsih: req.tsih,
            cid: req.cid,
            session,
            connection,
            authenticated_user,
            next_stat_sn: self.stat_sn.wrapping_add(1),
            exp_cmd_sn: self.exp_cmd_sn,
        };
        let tsih = policy
            .admit(&outcome)
            .map_err(|r| Failure::new(r, "session admission refused"))?;
        if tsih == 0 || (req.tsih != 0 && tsih != req.tsih) {
            return Err(Failure::new(
                LoginRefusal::TargetError,
                format!("policy returned TSIH {tsih} for requested {}", req.tsih),
            ));
        }
        let mut resp = self.response(req, true, stage::FULL_FEATURE_PHASE, out.finish());
        resp.tsih = tsih;
        Ok((State::Done, LoginStep::Complete(resp, Box::new(outcome))))
    }
}
