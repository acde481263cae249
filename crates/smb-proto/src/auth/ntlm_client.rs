//! The client side of NTLMv2 (MS-NLMP 3.1.5, 3.3.2): the NEGOTIATE, the AUTHENTICATE with its
//! NTLMv2 response computed from the CHALLENGE, the session keys with the key exchange, and the
//! MIC over the three messages. Randomness (client challenge, exported session key) and the
//! time are inputs, so every byte is reproducible.

use super::ntlm::{
    av, flags, AuthenticateMessage, AvPair, ChallengeMessage, NegotiateMessage, MIC_OFFSET,
};
use super::ntlm_server::{compute_mic, hmac_md5, nt_hash, ntowf_v2, GssKeys, NtlmKeys};
use super::rc4::Rc4;
use super::AuthError;
use crate::wire::utf16le;

/// The NEGOTIATE flags the client asks for: Unicode, NTLMv2 with extended session security,
/// signing and sealing with 128-bit keys, key exchange and the VERSION field.
pub const CLIENT_FLAGS: u32 = flags::UNICODE
    | flags::REQUEST_TARGET
    | flags::SIGN
    | flags::SEAL
    | flags::NTLM
    | flags::ALWAYS_SIGN
    | flags::EXTENDED_SESSIONSECURITY
    | flags::VERSION
    | flags::NEG_128
    | flags::KEY_EXCH
    | flags::NEG_56;

/// The VERSION the client sends (MS-NLMP 2.2.2.10): 10.0, NTLMSSP revision 15.
pub const CLIENT_VERSION: [u8; 8] = [10, 0, 0x61, 0x4a, 0, 0, 0, 15];

/// Who signs in.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub domain: String,
    pub password: String,
    pub workstation: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}\\{})", self.domain, self.user)
    }
}

/// The caller's random draws and clock for one exchange.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ClientRandom {
    pub client_challenge: [u8; 8],
    /// The ExportedSessionKey sent under the key exchange.
    pub session_key: [u8; 16],
    /// The current time as a FILETIME, used when the CHALLENGE carries no timestamp.
    pub now: u64,
}

impl std::fmt::Debug for ClientRandom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientRandom(..)")
    }
}

/// The NTLMv2 response and what it keys (MS-NLMP 3.3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NtlmV2Computed {
    /// NTProofStr || temp.
    pub nt_response: Vec<u8>,
    /// The LMv2 response (HMAC || client challenge).
    pub lm_response: Vec<u8>,
    pub session_base_key: [u8; 16],
}

/// NTLMv2 from the response key: `temp = 1, 1, Z(6), time, client challenge, Z(4), target
/// info, Z(4)`; NTProofStr = HMAC_MD5(key, server challenge || temp).
pub fn ntlmv2_response(
    response_key: &[u8; 16],
    server_challenge: &[u8; 8],
    client_challenge: &[u8; 8],
    time: u64,
    target_info: &[AvPair],
) -> NtlmV2Computed {
    let mut temp = vec![1u8, 1, 0, 0, 0, 0, 0, 0];
    temp.extend_from_slice(&time.to_le_bytes());
    temp.extend_from_slice(client_challenge);
    temp.extend_from_slice(&[0; 4]);
    super::ntlm::encode_av_pairs(target_info, &mut temp);
    temp.extend_from_slice(&[0; 4]);
    let proof = hmac_md5(response_key, &[server_challenge, &temp]);
    let mut nt_response = proof.to_vec();
    nt_response.extend_from_slice(&temp);
    let mut lm_response = hmac_md5(response_key, &[server_challenge, client_challenge]).to_vec();
    lm_response.extend_from_slice(client_challenge);
    NtlmV2Computed {
        nt_response,
        lm_response,
        session_base_key: hmac_md5(response_key, &[&proof]),
    }
}

/// A finished client-side exchange: the keys and the flags both sides settled on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSession {
    pub flags: u32,
    pub keys: NtlmKeys,
    gss: GssKeys,
}

impl ClientSession {
    /// The session key SMB derives its keys from.
    pub fn session_key(&self) -> [u8; 16] {
        self.keys.exported_session_key
    }
    fn key_exch(&self) -> bool {
        self.flags & flags::KEY_EXCH != 0
    }
    /// The client's SPNEGO mechListMIC over the DER mechTypes list.
    pub fn client_mic(&self, mech_types_der: &[u8]) -> [u8; 16] {
        let g = &self.gss;
        super::ntlm_server::gss_mic(
            &g.client_sign,
            &g.client_seal,
            0,
            mech_types_der,
            self.key_exch(),
        )
    }
    /// Checks the server's mechListMIC over the same list.
    pub fn verify_server_mic(&self, mech_types_der: &[u8], mic: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        let g = &self.gss;
        let want = super::ntlm_server::gss_mic(
            &g.server_sign,
            &g.server_seal,
            0,
            mech_types_der,
            self.key_exch(),
        );
        bool::from(want.ct_eq(mic))
    }
}

/// The NTLM exchange on the client, one state per step.
#[derive(Debug, Clone)]
pub enum NtlmClient {
    Start {
        credentials: Credentials,
        random: ClientRandom,
    },
    AwaitChallenge {
        credentials: Credentials,
        random: ClientRandom,
        negotiate: Vec<u8>,
    },
    Done,
}

impl NtlmClient {
    pub fn new(credentials: Credentials, random: ClientRandom) -> Self {
        NtlmClient::Start {
            credentials,
            random,
        }
    }

    /// The NEGOTIATE to send first.
    pub fn negotiate(&mut self) -> Result<Vec<u8>, AuthError> {
        let NtlmClient::Start {
            credentials,
            random,
        } = std::mem::replace(self, NtlmClient::Done)
        else {
            return Err(AuthError::OutOfOrder);
        };
        let negotiate = NegotiateMessage {
            flags: CLIENT_FLAGS,
            domain: &[],
            workstation: &[],
        }
        .encode(CLIENT_VERSION);
        *self = NtlmClient::AwaitChallenge {
            credentials,
            random,
            negotiate: negotiate.clone(),
        };
        Ok(negotiate)
    }

    /// Takes the server's CHALLENGE and returns the AUTHENTICATE with the session's keys.
    /// With a server timestamp the LM response is zeros and a MIC is sent (MS-NLMP 3.1.5.1.2).
    pub fn authenticate(&mut self, token: &[u8]) -> Result<(Vec<u8>, ClientSession), AuthError> {
        let NtlmClient::AwaitChallenge {
            credentials: c,
            random,
            negotiate,
        } = std::mem::replace(self, NtlmClient::Done)
        else {
            return Err(AuthError::OutOfOrder);
        };
        let challenge = ChallengeMessage::decode(token)?;
        if challenge.flags & flags::UNICODE == 0 {
            return Err(AuthError::NotNtlmV2);
        }
        let flags = challenge.flags & CLIENT_FLAGS;
        let response_key = ntowf_v2(&nt_hash(&c.password), &c.user, &c.domain);
        let server_time = challenge.timestamp();
        let mut info = challenge.target_info.clone();
        if server_time.is_some() {
            info.retain(|p| p.id != av::FLAGS);
            info.push(AvPair {
                id: av::FLAGS,
                value: av::FLAG_MIC_PRESENT.to_le_bytes().to_vec(),
            });
        }
        let v2 = ntlmv2_response(
            &response_key,
            &challenge.server_challenge,
            &random.client_challenge,
            server_time.unwrap_or(random.now),
            &info,
        );
        let (exported, encrypted) = if flags & flags::KEY_EXCH != 0 {
            let mut k = random.session_key;
            Rc4::new(&v2.session_base_key).apply(&mut k);
            (random.session_key, Some(k))
        } else {
            (v2.session_base_key, None)
        };
        let (domain, user, workstation) = (
            utf16le(&c.domain),
            utf16le(&c.user),
            utf16le(&c.workstation),
        );
        let lm = if server_time.is_some() {
            vec![0u8; 24]
        } else {
            v2.lm_response.clone()
        };
        let mut auth = AuthenticateMessage {
            lm_response: &lm,
            nt_response: &v2.nt_response,
            domain: &domain,
            user: &user,
            workstation: &workstation,
            encrypted_random_session_key: encrypted.as_ref().map_or(&[][..], |k| &k[..]),
            flags,
            mic: server_time.map(|_| [0u8; 16]),
        }
        .encode(CLIENT_VERSION);
        if server_time.is_some() {
            let mic = compute_mic(&exported, &negotiate, token, &auth);
            if let Some(slot) = auth.get_mut(MIC_OFFSET..MIC_OFFSET + 16) {
                slot.copy_from_slice(&mic);
            }
        }
        let session = ClientSession {
            flags,
            keys: NtlmKeys {
                session_base_key: v2.session_base_key,
                exported_session_key: exported,
            },
            gss: GssKeys::derive(&exported),
        };
        Ok((auth, session))
    }
}
