//! The security-negotiation sub-states of a login: AuthMethod choice, then the CHAP exchange
//! (RFC 7143 6.3, 12.1.3).

use super::LoginRefusal;
use crate::chap::{self, ChapChallenge, ChapCredentials};
use crate::negotiation::{classify, KeyClass};
use crate::text::{self, TextBuilder, REJECT};

/// A refusal with the detail for the log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failure {
    pub refusal: LoginRefusal,
    pub reason: String,
}

impl Failure {
    pub fn new(refusal: LoginRefusal, reason: impl Into<String>) -> Self {
        Failure {
            refusal,
            reason: reason.into(),
        }
    }
}

/// Where the security stage stands.
#[derive(Debug, Clone)]
pub(super) enum AuthState {
    /// Waiting for AuthMethod; `credentials` is what the policy demands (None: no CHAP).
    AwaitAuthMethod {
        credentials: Option<ChapCredentials>,
    },
    /// AuthMethod=CHAP agreed; waiting for CHAP_A.
    AwaitAlgorithm(ChapCredentials),
    /// CHAP_A/CHAP_I/CHAP_C sent; waiting for CHAP_N/CHAP_R (and CHAP_I/CHAP_C if mutual).
    AwaitResponse(Box<ChapChallenge>),
    /// The initiator is authenticated (`user` is its CHAP_N, None with AuthMethod=None).
    Authenticated { user: Option<String> },
}

fn value<'a>(pairs: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

fn chap_failure(e: chap::ChapError) -> Failure {
    Failure::new(LoginRefusal::AuthenticationFailed, e.to_string())
}

impl AuthState {
    /// Processes the security keys of one complete request, writing answers to `out`.
    pub fn step(
        self,
        pairs: &[(&str, &str)],
        random: &mut dyn FnMut(&mut [u8]),
        out: &mut TextBuilder,
    ) -> Result<AuthState, Failure> {
        let has_other_security_key = pairs
            .iter()
            .any(|(k, _)| classify(k) == KeyClass::Security && *k != "AuthMethod");
        match self {
            AuthState::AwaitAuthMethod { credentials } => {
                let Some(offered) = value(pairs, "AuthMethod") else {
                    if has_other_security_key {
                        return Err(Failure::new(
                            LoginRefusal::InitiatorError,
                            "authentication keys before AuthMethod",
                        ));
                    }
                    return Ok(AuthState::AwaitAuthMethod { credentials });
                };
                // RFC 7143 6.2.1: the first method in the initiator's list that we accept.
                let wanted = if credentials.is_some() {
                    "CHAP"
                } else {
                    "None"
                };
                if !text::parse_list(offered).any(|m| m == wanted) {
                    out.push("AuthMethod", REJECT);
                    return Err(Failure::new(
                        LoginRefusal::AuthenticationFailed,
                        format!("AuthMethod={offered} offered, {wanted} required"),
                    ));
                }
                out.push("AuthMethod", wanted);
                match credentials {
                    None => {
                        if has_other_security_key {
                            return Err(Failure::new(
                                LoginRefusal::InitiatorError,
                                "authentication keys with AuthMethod=None",
                            ));
                        }
                        Ok(AuthState::Authenticated { user: None })
                    }
                    Some(c) if value(pairs, "CHAP_A").is_some() => {
                        // Early CHAP_A in the same request: answer it at once.
                        AuthState::AwaitAlgorithm(c).step_chap(pairs, random, out)
                    }
                    Some(c) => Ok(AuthState::AwaitAlgorithm(c)),
                }
            }
            other => {
                if value(pairs, "AuthMethod").is_some() {
                    // RFC 7143 6.2: renegotiation is an initiator error.
                    return Err(Failure::new(
                        LoginRefusal::InitiatorError,
                        "AuthMethod sent twice",
                    ));
                }
                other.step_chap(pairs, random, out)
            }
        }
    }

    fn step_chap(
        self,
        pairs: &[(&str, &str)],
        random: &mut dyn FnMut(&mut [u8]),
        out: &mut TextBuilder,
    ) -> Result<AuthState, Failure> {
        match self {
            AuthState::AwaitAlgorithm(credentials) => {
                let challenge = chap::start(credentials, pairs, random, out).map_err(|e| {
                    if e == chap::ChapError::NoAcceptableAlgorithm {
                        out.push("CHAP_A", REJECT);
                    }
                    chap_failure(e)
                })?;
                Ok(AuthState::AwaitResponse(Box::new(challenge)))
            }
            AuthState::AwaitResponse(challenge) => {
                let user = challenge.verify(pairs, out).map_err(chap_failure)?;
                Ok(AuthState::Authenticated { user: Some(user) })
            }
            AuthState::Authenticated { user } => {
                if pairs.iter().any(|(k, _)| classify(k) == KeyClass::Security) {
                    return Err(Failure::new(
                        LoginRefusal::InitiatorError,
                        "authentication keys after authentication completed",
                    ));
                }
                Ok(AuthState::Authenticated { user })
            }
            state @ AuthState::AwaitAuthMethod { .. } => Ok(state),
        }
    }

    /// The initiator asks to leave the security stage (T=1). Returns the state to continue
    /// from: `Authenticated` allows the transition, a CHAP exchange still running keeps the
    /// stage (the response goes out with T=0), a skipped required authentication fails.
    pub fn on_transit(self) -> Result<AuthState, Failure> {
        match self {
            // No AuthMethod sent and none required: nothing to authenticate.
            AuthState::AwaitAuthMethod { credentials: None } => {
                Ok(AuthState::Authenticated { user: None })
            }
            AuthState::AwaitAuthMethod {
                credentials: Some(_),
            } => Err(Failure::new(
                LoginRefusal::AuthenticationFailed,
                "initiator left the security stage without authenticating",
            )),
            other => Ok(other),
        }
    }
}
