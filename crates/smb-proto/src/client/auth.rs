//! SPNEGO around the client's NTLMv2 (RFC 4178, MS-SPNG 3.1.5): a NegTokenInit offering
//! NTLMSSP with the NEGOTIATE inside, a NegTokenResp with the AUTHENTICATE and the
//! mechListMIC, and the check of the server's final mechListMIC.
//!
//! ```text
//! Start --first_token--> AwaitChallenge --on_challenge--> AwaitResult --on_result--> Done
//! ```

use crate::auth::ntlm_client::{ClientRandom, ClientSession, Credentials, NtlmClient};
use crate::auth::spnego::{
    client_neg_token_resp, neg_token_init, ntlm_mech_types, parse_client_token, ClientToken,
    NegState,
};
use crate::auth::AuthError;
use crate::error::DecodeError;

#[derive(Debug, Clone)]
pub enum ClientAuth {
    Start(NtlmClient),
    AwaitChallenge(NtlmClient),
    AwaitResult(Box<ClientSession>),
    Done,
}

/// negState, responseToken and mechListMIC of a server's NegTokenResp.
type ServerFields<'a> = (Option<u8>, Option<&'a [u8]>, Option<&'a [u8]>);

fn server_fields(token: &[u8]) -> Result<ServerFields<'_>, AuthError> {
    match parse_client_token(token)? {
        ClientToken::Resp {
            neg_state,
            response_token,
            mech_list_mic,
            ..
        } => Ok((neg_state, response_token, mech_list_mic)),
        _ => Err(AuthError::Malformed(DecodeError::Invalid(
            "SPNEGO: server sent no NegTokenResp",
        ))),
    }
}

impl ClientAuth {
    pub fn new(credentials: Credentials, random: ClientRandom) -> Self {
        ClientAuth::Start(NtlmClient::new(credentials, random))
    }

    /// The first SESSION_SETUP security buffer.
    pub fn first_token(&mut self) -> Result<Vec<u8>, AuthError> {
        let ClientAuth::Start(mut ntlm) = std::mem::replace(self, ClientAuth::Done) else {
            return Err(AuthError::OutOfOrder);
        };
        let negotiate = ntlm.negotiate()?;
        *self = ClientAuth::AwaitChallenge(ntlm);
        Ok(neg_token_init(&negotiate))
    }

    /// Takes the server's token carrying the CHALLENGE; returns the token with the
    /// AUTHENTICATE and the mechListMIC.
    pub fn on_challenge(&mut self, token: &[u8]) -> Result<Vec<u8>, AuthError> {
        let ClientAuth::AwaitChallenge(mut ntlm) = std::mem::replace(self, ClientAuth::Done) else {
            return Err(AuthError::OutOfOrder);
        };
        let (state, inner, _) = server_fields(token)?;
        if state == Some(NegState::Reject as u8) {
            return Err(AuthError::BadResponse);
        }
        let challenge = inner.ok_or(AuthError::Malformed(DecodeError::Invalid(
            "SPNEGO: no CHALLENGE",
        )))?;
        let (auth, session) = ntlm.authenticate(challenge)?;
        let mic = session.client_mic(&ntlm_mech_types());
        *self = ClientAuth::AwaitResult(Box::new(session));
        Ok(client_neg_token_resp(&auth, Some(&mic)))
    }

    /// Takes the server's last token (which may be empty) and returns the finished session;
    /// a mechListMIC in it must verify.
    pub fn on_result(&mut self, token: &[u8]) -> Result<ClientSession, AuthError> {
        let ClientAuth::AwaitResult(session) = std::mem::replace(self, ClientAuth::Done) else {
            return Err(AuthError::OutOfOrder);
        };
        if token.is_empty() {
            return Ok(*session);
        }
        let (state, _, mic) = server_fields(token)?;
        if state.is_some_and(|s| s != NegState::AcceptCompleted as u8) {
            return Err(AuthError::BadResponse);
        }
        if let Some(mic) = mic {
            if !session.verify_server_mic(&ntlm_mech_types(), mic) {
                return Err(AuthError::BadMic);
            }
        }
        Ok(*session)
    }
}
