//! The server side of NTLMv2 (MS-NLMP 3.2.5, 3.3.2, 3.4): the CHALLENGE, the check of the
//! client's NTLMv2 response against a stored NT hash, the session keys, the MIC, and the
//! GSS_GetMIC signatures SPNEGO's mechListMIC needs. Randomness (the server challenge) and time
//! (the timestamp AV pair) are inputs.

use hmac::{Hmac, Mac};
use md4::Md4;
use md5::{Digest, Md5};
use subtle::ConstantTimeEq;

use super::ntlm::{
    av, flags, AuthenticateMessage, AvPair, ChallengeMessage, NegotiateMessage, NtlmV2Response,
    MIC_OFFSET,
};
use super::rc4::Rc4;
use super::AuthError;
use crate::wire::utf16le;

type HmacMd5 = Hmac<Md5>;

pub(crate) fn hmac_md5(key: &[u8], parts: &[&[u8]]) -> [u8; 16] {
    // HMAC accepts keys of any length.
    let Ok(mut m) = <HmacMd5 as Mac>::new_from_slice(key) else {
        return [0; 16];
    };
    parts.iter().for_each(|p| m.update(p));
    m.finalize().into_bytes().into()
}

fn md5(parts: &[&[u8]]) -> [u8; 16] {
    let mut h = Md5::new();
    parts.iter().for_each(|p| h.update(p));
    h.finalize().into()
}

/// NTOWFv1: MD4 of the UTF-16LE password, the "NT hash" a server stores.
pub fn nt_hash(password: &str) -> [u8; 16] {
    let mut h = Md4::new();
    h.update(utf16le(password));
    h.finalize().into()
}

/// NTOWFv2: HMAC-MD5 under the NT hash of UTF-16LE(uppercase(user) || domain).
pub fn ntowf_v2(nt_hash: &[u8; 16], user: &str, domain: &str) -> [u8; 16] {
    let who = utf16le(&format!("{}{}", user.to_uppercase(), domain));
    hmac_md5(nt_hash, &[&who])
}

/// The outcome of a verified NTLMv2 response.
#[derive(Clone, PartialEq, Eq)]
pub struct NtlmKeys {
    pub session_base_key: [u8; 16],
    /// The key SMB takes as the session key.
    pub exported_session_key: [u8; 16],
}

impl std::fmt::Debug for NtlmKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NtlmKeys(..)")
    }
}

/// Checks the NTLMv2 response of `auth` for the user's NT hash and the challenge the server
/// sent, and derives the keys (MS-NLMP 3.3.2; KXKEY is the session base key for NTLMv2).
pub fn verify_ntlmv2(
    auth: &AuthenticateMessage<'_>,
    nt_hash: &[u8; 16],
    server_challenge: &[u8; 8],
) -> Result<NtlmKeys, AuthError> {
    if auth.nt_response.is_empty() {
        return Err(AuthError::Anonymous);
    }
    if auth.nt_response.len() <= 24 {
        return Err(AuthError::NotNtlmV2);
    }
    let resp = NtlmV2Response::decode(auth.nt_response)?;
    let user = auth.user_name()?;
    let domain = auth.domain_name()?;
    // The domain as sent first, then upper-cased, then empty: clients differ in which one
    // they fold into NTOWFv2.
    let mut found = None;
    for d in [domain.clone(), domain.to_uppercase(), String::new()] {
        let key = ntowf_v2(nt_hash, &user, &d);
        let proof = hmac_md5(&key, &[server_challenge, resp.blob]);
        if bool::from(proof.ct_eq(resp.nt_proof_str)) {
            found = Some((key, proof));
            break;
        }
    }
    let (key, proof) = found.ok_or(AuthError::BadResponse)?;
    let session_base_key = hmac_md5(&key, &[&proof]);
    let exported_session_key = if auth.flags & flags::KEY_EXCH != 0 {
        let enc: [u8; 16] = auth
            .encrypted_random_session_key
            .try_into()
            .map_err(|_| AuthError::BadResponse)?;
        let mut k = enc;
        Rc4::new(&session_base_key).apply(&mut k);
        k
    } else {
        session_base_key
    };
    Ok(NtlmKeys {
        session_base_key,
        exported_session_key,
    })
}

/// The MIC over the three messages (MS-NLMP 3.1.5.1.2), the AUTHENTICATE's MIC field zeroed.
pub fn compute_mic(
    exported: &[u8; 16],
    negotiate: &[u8],
    challenge: &[u8],
    auth: &[u8],
) -> [u8; 16] {
    let mut zeroed = auth.to_vec();
    if let Some(m) = zeroed.get_mut(MIC_OFFSET..MIC_OFFSET + 16) {
        m.fill(0);
    }
    hmac_md5(exported, &[negotiate, challenge, &zeroed])
}

const C2S_SIGN: &[u8] = b"session key to client-to-server signing key magic constant\0";
const S2C_SIGN: &[u8] = b"session key to server-to-client signing key magic constant\0";
const C2S_SEAL: &[u8] = b"session key to client-to-server sealing key magic constant\0";
const S2C_SEAL: &[u8] = b"session key to server-to-client sealing key magic constant\0";

/// SIGNKEY and SEALKEY (MS-NLMP 3.4.5.2, 3.4.5.3) with extended session security and 128-bit
/// keys.
#[derive(Clone, PartialEq, Eq)]
pub struct GssKeys {
    pub client_sign: [u8; 16],
    pub server_sign: [u8; 16],
    pub client_seal: [u8; 16],
    pub server_seal: [u8; 16],
}

impl GssKeys {
    pub fn derive(exported: &[u8; 16]) -> Self {
        GssKeys {
            client_sign: md5(&[exported, C2S_SIGN]),
            server_sign: md5(&[exported, S2C_SIGN]),
            client_seal: md5(&[exported, C2S_SEAL]),
            server_seal: md5(&[exported, S2C_SEAL]),
        }
    }
}

/// The NTLM signature of `msg` (MS-NLMP 3.4.4.2, extended session security) for the first
/// message under a fresh sealing state: Version 1, the HMAC-MD5 checksum (RC4-sealed when
/// KEY_EXCH was negotiated), and the sequence number.
pub fn gss_mic(sign: &[u8; 16], seal: &[u8; 16], seq: u32, msg: &[u8], key_exch: bool) -> [u8; 16] {
    let full = hmac_md5(sign, &[&seq.to_le_bytes(), msg]);
    let mut checksum = [0u8; 8];
    checksum.copy_from_slice(full.get(..8).unwrap_or(&[0; 8]));
    if key_exch {
        Rc4::new(seal).apply(&mut checksum);
    }
    let mut out = [0u8; 16];
    out[..4].copy_from_slice(&1u32.to_le_bytes());
    out[4..12].copy_from_slice(&checksum);
    out[12..].copy_from_slice(&seq.to_le_bytes());
    out
}

/// What the server puts into its CHALLENGE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChallengeParams {
    /// Eight random bytes, drawn by the caller.
    pub server_challenge: [u8; 8],
    /// The current time as a FILETIME, for MsvAvTimestamp.
    pub timestamp: u64,
    pub nb_domain: String,
    pub nb_computer: String,
    pub dns_domain: String,
    pub dns_computer: String,
    /// The VERSION structure (MS-NLMP 2.2.2.10).
    pub version: [u8; 8],
}

/// A finished NTLM authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NtlmSession {
    pub user: String,
    pub domain: String,
    pub workstation: String,
    pub flags: u32,
    /// The client's timestamp from its NTLMv2 response, for a clock-skew check by the caller.
    pub client_timestamp: u64,
    pub keys: NtlmKeys,
    pub gss: GssKeysDebug,
}

impl std::fmt::Debug for GssKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GssKeys(..)")
    }
}

/// GssKeys that print without their bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct GssKeysDebug(pub GssKeys);

impl std::fmt::Debug for GssKeysDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GssKeys(..)")
    }
}

impl NtlmSession {
    /// The session key SMB derives its keys from.
    pub fn session_key(&self) -> [u8; 16] {
        self.keys.exported_session_key
    }
    fn key_exch(&self) -> bool {
        self.flags & flags::KEY_EXCH != 0
    }
    /// Checks the client's SPNEGO mechListMIC over the DER mechTypes list.
    pub fn verify_client_mic(&self, mech_types_der: &[u8], mic: &[u8]) -> bool {
        let k = &self.gss.0;
        let want = gss_mic(
            &k.client_sign,
            &k.client_seal,
            0,
            mech_types_der,
            self.key_exch(),
        );
        bool::from(want.ct_eq(mic))
    }
    /// The server's mechListMIC over the same list.
    pub fn server_mic(&self, mech_types_der: &[u8]) -> [u8; 16] {
        let k = &self.gss.0;
        gss_mic(
            &k.server_sign,
            &k.server_seal,
            0,
            mech_types_der,
            self.key_exch(),
        )
    }
}

/// The NTLM exchange on the server, one state per step.
#[derive(Debug, Clone)]
pub enum NtlmServer {
    AwaitNegotiate(ChallengeParams),
    AwaitAuthenticate {
        negotiate: Vec<u8>,
        challenge: Vec<u8>,
        server_challenge: [u8; 8],
    },
    Done,
}

impl NtlmServer {
    pub fn new(params: ChallengeParams) -> Self {
        NtlmServer::AwaitNegotiate(params)
    }

    /// Takes the client's NEGOTIATE and returns the CHALLENGE to send.
    pub fn negotiate(&mut self, token: &[u8]) -> Result<Vec<u8>, AuthError> {
        let NtlmServer::AwaitNegotiate(p) = self else {
            return Err(AuthError::OutOfOrder);
        };
        let neg = NegotiateMessage::decode(token)?;
        let challenge = ChallengeMessage {
            target_name: p.nb_domain.clone(),
            flags: ChallengeMessage::answer_flags(neg.flags),
            server_challenge: p.server_challenge,
            target_info: vec![
                AvPair::name(av::NB_DOMAIN_NAME, &p.nb_domain),
                AvPair::name(av::NB_COMPUTER_NAME, &p.nb_computer),
                AvPair::name(av::DNS_DOMAIN_NAME, &p.dns_domain),
                AvPair::name(av::DNS_COMPUTER_NAME, &p.dns_computer),
                AvPair::timestamp(p.timestamp),
            ],
            version: p.version,
        }
        .encode();
        *self = NtlmServer::AwaitAuthenticate {
            negotiate: token.to_vec(),
            challenge: challenge.clone(),
            server_challenge: p.server_challenge,
        };
        Ok(challenge)
    }

    /// Takes the AUTHENTICATE; `lookup(user, domain)` gives the user's NT hash. Verifies the
    /// NTLMv2 response and, when the client says it sent one, the MIC.
    pub fn authenticate(
        &mut self,
        token: &[u8],
        lookup: impl FnOnce(&str, &str) -> Option<[u8; 16]>,
    ) -> Result<NtlmSession, AuthError> {
        let NtlmServer::AwaitAuthenticate {
            negotiate,
            challenge,
            server_challenge,
        } = &*self
        else {
            return Err(AuthError::OutOfOrder);
        };
        let auth = AuthenticateMessage::decode(token)?;
        let user = auth.user_name()?;
        let domain = auth.domain_name()?;
        if auth.nt_response.is_empty() && user.is_empty() {
            return Err(AuthError::Anonymous);
        }
        // A malformed NTLMv2 response (its client challenge or AV pairs cut short) is refused
        // as such before any user is looked up.
        let resp = if auth.nt_response.len() > 24 {
            Some(NtlmV2Response::decode(auth.nt_response)?)
        } else {
            None
        };
        let hash = lookup(&user, &domain).ok_or(AuthError::UnknownUser)?;
        let keys = verify_ntlmv2(&auth, &hash, server_challenge)?;
        let resp = resp.ok_or(AuthError::NotNtlmV2)?;
        if resp.av_flags() & av::FLAG_MIC_PRESENT != 0 {
            let mic = auth.mic.ok_or(AuthError::BadMic)?;
            let want = compute_mic(&keys.exported_session_key, negotiate, challenge, token);
            if !bool::from(want.ct_eq(&mic)) {
                return Err(AuthError::BadMic);
            }
        }
        let session = NtlmSession {
            workstation: auth.workstation_name()?,
            user,
            domain,
            flags: auth.flags,
            client_timestamp: resp.timestamp,
            gss: GssKeysDebug(GssKeys::derive(&keys.exported_session_key)),
            keys,
        };
        *self = NtlmServer::Done;
        Ok(session)
    }
}
