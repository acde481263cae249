//! The SESSION_SETUP authentication exchange on the server: SPNEGO around NTLMv2 (or raw
//! NTLMSSP), one step per request, including both mechListMICs (MS-SPNG 3.2.5.1).

use crate::auth::ntlm::message_type;
use crate::auth::ntlm_server::{ChallengeParams, NtlmServer, NtlmSession};
use crate::auth::spnego::{neg_token_resp, parse_client_token, ClientToken, NegState, OID_NTLMSSP};
use crate::auth::AuthError;

/// What to answer a SESSION_SETUP with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthStep {
    /// STATUS_MORE_PROCESSING_REQUIRED with this token.
    Continue(Vec<u8>),
    /// STATUS_SUCCESS with this token; the session key is `session.session_key()`.
    Done {
        session: Box<NtlmSession>,
        token: Vec<u8>,
    },
}

/// One session's authentication in progress.
#[derive(Debug, Clone)]
pub struct SessionAuth {
    ntlm: NtlmServer,
    /// The client's DER mechTypes list, once seen, for the mechListMICs.
    mech_types: Option<Vec<u8>>,
    /// Whether the client wraps in SPNEGO (raw NTLMSSP is answered raw).
    spnego: bool,
    /// NTLMSSP was not the client's first choice, so both mechListMICs are required
    /// (RFC 4178 5, negState request-mic).
    mic_required: bool,
    /// Whether a reply went out already (request-mic goes in the first only).
    replied: bool,
}

impl SessionAuth {
    pub fn new(params: ChallengeParams) -> Self {
        SessionAuth {
            ntlm: NtlmServer::new(params),
            mech_types: None,
            spnego: true,
            mic_required: false,
            replied: false,
        }
    }

    /// Takes the security buffer of one SESSION_SETUP request. `lookup(user, domain)` gives the
    /// user's NT hash.
    pub fn step(
        &mut self,
        buffer: &[u8],
        lookup: impl FnOnce(&str, &str) -> Option<[u8; 16]>,
    ) -> Result<AuthStep, AuthError> {
        let token = parse_client_token(buffer)?;
        if let ClientToken::Init {
            mech_types,
            mech_types_der,
            ..
        } = &token
        {
            if !mech_types.contains(&OID_NTLMSSP) {
                return Err(AuthError::Malformed(crate::error::DecodeError::Invalid(
                    "SPNEGO: NTLMSSP not offered",
                )));
            }
            self.mech_types = Some(mech_types_der.to_vec());
            self.mic_required = mech_types.first() != Some(&OID_NTLMSSP);
        }
        self.spnego = !matches!(token, ClientToken::RawNtlmssp(_));
        // An optimistic token for another mechanism is ignored; the client then sends NTLM.
        let ntlm = token.ntlm().filter(|t| message_type(t).is_some());
        match ntlm.and_then(message_type) {
            Some(1) => {
                let challenge = self.ntlm.negotiate(ntlm.unwrap_or(&[]))?;
                let state = self.first_state();
                Ok(AuthStep::Continue(self.wrap(state, Some(&challenge), None)))
            }
            Some(3) => {
                if self.mic_required && token.mech_list_mic().is_none() {
                    return Err(AuthError::BadMic);
                }
                let session = self.ntlm.authenticate(ntlm.unwrap_or(&[]), lookup)?;
                let mut server_mic = None;
                if let (Some(list), Some(mic)) = (&self.mech_types, token.mech_list_mic()) {
                    if !session.verify_client_mic(list, mic) {
                        return Err(AuthError::BadMic);
                    }
                    server_mic = Some(session.server_mic(list));
                }
                let token = if self.spnego {
                    neg_token_resp(
                        NegState::AcceptCompleted,
                        None,
                        None,
                        server_mic.as_ref().map(|m| &m[..]),
                    )
                } else {
                    Vec::new()
                };
                Ok(AuthStep::Done {
                    session: Box::new(session),
                    token,
                })
            }
            Some(t) => Err(AuthError::UnexpectedMessage(t)),
            None if matches!(token, ClientToken::Init { .. }) => {
                // No NTLM token yet: name the mechanism and wait for the NEGOTIATE.
                let state = self.first_state();
                Ok(AuthStep::Continue(neg_token_resp(
                    state,
                    Some(OID_NTLMSSP),
                    None,
                    None,
                )))
            }
            None => Err(AuthError::OutOfOrder),
        }
    }

    fn first_state(&mut self) -> NegState {
        let first = !self.replied;
        self.replied = true;
        if self.mic_required && first {
            NegState::RequestMic
        } else {
            NegState::AcceptIncomplete
        }
    }

    fn wrap(&self, state: NegState, inner: Option<&[u8]>, mic: Option<&[u8]>) -> Vec<u8> {
        if self.spnego {
            neg_token_resp(state, Some(OID_NTLMSSP), inner, mic)
        } else {
            inner.unwrap_or(&[]).to_vec()
        }
    }
}
