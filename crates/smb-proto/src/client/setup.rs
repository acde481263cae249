//! The client's SESSION_SETUP exchange (MS-SMB2 3.2.4.2.3, 3.2.5.3), for a new session or for
//! binding a new channel to an existing one (SMB2_SESSION_FLAG_BINDING).
//!
//! The session's preauth hash starts from the connection's (NEGOTIATE request and response)
//! and takes every SESSION_SETUP request and every STATUS_MORE_PROCESSING_REQUIRED response;
//! the keys come from its value before the final response, which must be signed with them:
//! the session signing key for a new session, the channel signing key for a binding.
//! A binding's requests are signed with the session's own signing key.
//!
//! ```text
//! AwaitChallenge --MORE_PROCESSING_REQUIRED--> AwaitResult --SUCCESS--> done
//!        \--------------- any other status: error ---------------/
//! ```

use super::auth::ClientAuth;
use super::ClientError;
use crate::auth::ntlm_client::{ClientRandom, Credentials};
use crate::crypto::{Cipher, PreauthHash, SessionKeys, SigningAlgorithm, SigningKey};
use crate::msg::session::SESSION_FLAG_BINDING;
use crate::msg::{Message as _, SessionSetupResponse};
use crate::{Header, NtStatus};

/// The session a binding joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub session_id: u64,
    /// The session's signing key, which signs the binding requests.
    pub session_signing: SigningKey,
}

/// A finished exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupDone {
    pub session_id: u64,
    /// SessionFlags of the final response (IS_GUEST, IS_NULL, ENCRYPT_DATA).
    pub session_flags: u16,
    /// The session's keys (for a binding, the cipher keys are the session's already).
    pub keys: SessionKeys,
    /// The key this channel signs with: the session signing key, or the channel signing key
    /// of a binding.
    pub channel_signing: SigningKey,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupStep {
    /// Send another SESSION_SETUP with this security buffer.
    Send(Vec<u8>),
    Done(Box<SetupDone>),
}

#[derive(Debug, Clone)]
pub enum SessionSetup {
    AwaitChallenge {
        auth: ClientAuth,
        preauth: PreauthHash,
        binding: Option<Binding>,
    },
    AwaitResult {
        auth: ClientAuth,
        preauth: PreauthHash,
        binding: Option<Binding>,
        session_id: u64,
    },
    Done,
}

impl SessionSetup {
    /// Starts the exchange on a connection whose preauth hash (after NEGOTIATE) is
    /// `connection_preauth`; returns the state and the first security buffer.
    pub fn start(
        credentials: Credentials,
        random: ClientRandom,
        connection_preauth: PreauthHash,
        binding: Option<Binding>,
    ) -> Result<(Self, Vec<u8>), ClientError> {
        let mut auth = ClientAuth::new(credentials, random);
        let token = auth.first_token()?;
        Ok((
            SessionSetup::AwaitChallenge {
                auth,
                preauth: connection_preauth,
                binding,
            },
            token,
        ))
    }

    /// The SESSION_SETUP request Flags field.
    pub fn request_flags(&self) -> u8 {
        if self.binding().is_some() {
            SESSION_FLAG_BINDING
        } else {
            0
        }
    }

    /// The SessionId the next request carries (0 until the server named the new session).
    pub fn session_id(&self) -> u64 {
        match self {
            SessionSetup::AwaitChallenge { binding, .. } => {
                binding.as_ref().map_or(0, |b| b.session_id)
            }
            SessionSetup::AwaitResult { session_id, .. } => *session_id,
            SessionSetup::Done => 0,
        }
    }

    fn binding(&self) -> Option<&Binding> {
        match self {
            SessionSetup::AwaitChallenge { binding, .. }
            | SessionSetup::AwaitResult { binding, .. } => binding.as_ref(),
            SessionSetup::Done => None,
        }
    }

    /// The key a request of this exchange is signed with: the session's, when binding.
    pub fn request_key(&self) -> Option<&SigningKey> {
        self.binding().map(|b| &b.session_signing)
    }

    /// Records a request as sent (signed, header first, without the transport prefix).
    pub fn sent(&mut self, request: &[u8]) {
        if let SessionSetup::AwaitChallenge { preauth, .. }
        | SessionSetup::AwaitResult { preauth, .. } = self
        {
            preauth.update(request);
        }
    }

    /// Takes a SESSION_SETUP response (the whole message, header first). `signing` and
    /// `cipher` are what the connection negotiated.
    pub fn on_response(
        &mut self,
        msg: &[u8],
        signing: SigningAlgorithm,
        cipher: Option<Cipher>,
    ) -> Result<SetupStep, ClientError> {
        let header = Header::decode(msg)?;
        let status = header.nt_status();
        match std::mem::replace(self, SessionSetup::Done) {
            SessionSetup::AwaitChallenge {
                mut auth,
                mut preauth,
                binding,
            } if status == NtStatus::MORE_PROCESSING_REQUIRED => {
                if let Some(b) = &binding {
                    if header.session_id != b.session_id {
                        return Err(ClientError::Protocol(
                            "binding answered for another session",
                        ));
                    }
                    if header.flags.is_signed() && !b.session_signing.verify(msg) {
                        return Err(ClientError::BadSignature);
                    }
                }
                if header.session_id == 0 {
                    return Err(ClientError::Protocol(
                        "SESSION_SETUP response names no session",
                    ));
                }
                let resp = SessionSetupResponse::decode(msg)?;
                preauth.update(msg);
                let token = auth.on_challenge(resp.security_buffer)?;
                *self = SessionSetup::AwaitResult {
                    auth,
                    preauth,
                    binding,
                    session_id: header.session_id,
                };
                Ok(SetupStep::Send(token))
            }
            SessionSetup::AwaitResult {
                mut auth,
                preauth,
                binding,
                session_id,
            } if status == NtStatus::SUCCESS => {
                if header.session_id != session_id {
                    return Err(ClientError::Protocol(
                        "SESSION_SETUP answered for another session",
                    ));
                }
                let resp = SessionSetupResponse::decode(msg)?;
                let session = auth.on_result(resp.security_buffer)?;
                let key = session.session_key();
                let keys = SessionKeys::derive_311(&key, &preauth, cipher);
                let channel_signing = match &binding {
                    Some(_) => {
                        SigningKey::new(signing, SessionKeys::channel_signing_key(&key, &preauth))
                    }
                    None => SigningKey::new(signing, keys.signing),
                };
                // MS-SMB2 3.2.5.3.1: the final response of a 3.1.1 session setup is signed.
                if !header.flags.is_signed() || !channel_signing.verify(msg) {
                    return Err(ClientError::BadSignature);
                }
                Ok(SetupStep::Done(Box::new(SetupDone {
                    session_id,
                    session_flags: resp.session_flags,
                    keys,
                    channel_signing,
                })))
            }
            SessionSetup::Done => Err(ClientError::Protocol("SESSION_SETUP after the end")),
            _ if status == NtStatus::SUCCESS || status == NtStatus::MORE_PROCESSING_REQUIRED => {
                Err(ClientError::Protocol("SESSION_SETUP status out of order"))
            }
            _ => Err(ClientError::Status(status)),
        }
    }
}
