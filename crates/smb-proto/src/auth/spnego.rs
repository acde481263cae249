//! SPNEGO tokens (RFC 4178, MS-SPNG) as SMB carries them: the client's NegTokenInit inside a
//! GSS-API InitialContextToken, NegTokenResp both ways, and raw NTLMSSP, which clients may send
//! without the wrapping.

use super::der::{expect_only, read_tlv, tlv};
use crate::error::DecodeError;

/// DER contents of the SPNEGO OID, 1.3.6.1.5.5.2.
pub const OID_SPNEGO: &[u8] = &[0x2B, 0x06, 0x01, 0x05, 0x05, 0x02];
/// DER contents of the NTLMSSP OID, 1.3.6.1.4.1.311.2.2.10.
pub const OID_NTLMSSP: &[u8] = &[0x2B, 0x06, 0x01, 0x04, 0x01, 0x82, 0x37, 0x02, 0x02, 0x0A];

/// negState (RFC 4178 4.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NegState {
    AcceptCompleted = 0,
    AcceptIncomplete = 1,
    Reject = 2,
    RequestMic = 3,
}

/// A token from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientToken<'a> {
    Init {
        /// The mechanism OIDs (DER contents), most preferred first.
        mech_types: Vec<&'a [u8]>,
        /// The whole DER MechTypeList, which mechListMIC signs.
        mech_types_der: &'a [u8],
        mech_token: Option<&'a [u8]>,
        mech_list_mic: Option<&'a [u8]>,
    },
    Resp {
        neg_state: Option<u8>,
        supported_mech: Option<&'a [u8]>,
        response_token: Option<&'a [u8]>,
        mech_list_mic: Option<&'a [u8]>,
    },
    RawNtlmssp(&'a [u8]),
}

impl<'a> ClientToken<'a> {
    /// The NTLMSSP message inside, if any.
    pub fn ntlm(&self) -> Option<&'a [u8]> {
        match self {
            ClientToken::Init { mech_token, .. } => *mech_token,
            ClientToken::Resp { response_token, .. } => *response_token,
            ClientToken::RawNtlmssp(t) => Some(t),
        }
    }
    pub fn mech_list_mic(&self) -> Option<&'a [u8]> {
        match self {
            ClientToken::Init { mech_list_mic, .. } | ClientToken::Resp { mech_list_mic, .. } => {
                *mech_list_mic
            }
            ClientToken::RawNtlmssp(_) => None,
        }
    }
}

/// Walks the [n]-tagged fields of a SEQUENCE, in increasing tag order, each at most once.
fn fields(mut seq: &[u8]) -> Result<[Option<&[u8]>; 4], DecodeError> {
    let mut out: [Option<&[u8]>; 4] = [None; 4];
    let mut last: Option<usize> = None;
    while !seq.is_empty() {
        let (tag, value, rest) = read_tlv(seq)?;
        let n = usize::from(tag.wrapping_sub(0xA0));
        if tag < 0xA0 || n > 3 || last.is_some_and(|l| n <= l) {
            return Err(DecodeError::Invalid("SPNEGO: unexpected field"));
        }
        if let Some(slot) = out.get_mut(n) {
            *slot = Some(value);
        }
        last = Some(n);
        seq = rest;
    }
    Ok(out)
}

fn octets(v: Option<&[u8]>) -> Result<Option<&[u8]>, DecodeError> {
    v.map(|v| expect_only(v, 0x04)).transpose()
}

/// Parses a SESSION_SETUP security buffer from the client.
pub fn parse_client_token(buf: &[u8]) -> Result<ClientToken<'_>, DecodeError> {
    if buf.starts_with(super::ntlm::SIGNATURE) {
        return Ok(ClientToken::RawNtlmssp(buf));
    }
    match buf.first() {
        Some(0x60) => {
            let inner = expect_only(buf, 0x60)?;
            let (tag, oid, rest) = read_tlv(inner)?;
            if tag != 0x06 || oid != OID_SPNEGO {
                return Err(DecodeError::Invalid("SPNEGO: not the SPNEGO mechanism"));
            }
            let seq = expect_only(expect_only(rest, 0xA0)?, 0x30)?;
            let [mt, _flags, token, mic] = fields(seq)?;
            let mech_types_der = mt.ok_or(DecodeError::Invalid("SPNEGO: no mechTypes"))?;
            let mut list = expect_only(mech_types_der, 0x30)?;
            let mut mech_types = Vec::new();
            while !list.is_empty() {
                let (tag, oid, rest) = read_tlv(list)?;
                if tag != 0x06 {
                    return Err(DecodeError::Invalid("SPNEGO: mechType is not an OID"));
                }
                mech_types.push(oid);
                list = rest;
            }
            Ok(ClientToken::Init {
                mech_types,
                mech_types_der,
                mech_token: octets(token)?,
                mech_list_mic: octets(mic)?,
            })
        }
        Some(0xA1) => {
            let seq = expect_only(expect_only(buf, 0xA1)?, 0x30)?;
            let [state, mech, token, mic] = fields(seq)?;
            let neg_state = match state {
                Some(v) => {
                    let e = expect_only(v, 0x0A)?;
                    match e {
                        [b] => Some(*b),
                        _ => return Err(DecodeError::Invalid("SPNEGO: negState")),
                    }
                }
                None => None,
            };
            Ok(ClientToken::Resp {
                neg_state,
                supported_mech: mech.map(|m| expect_only(m, 0x06)).transpose()?,
                response_token: octets(token)?,
                mech_list_mic: octets(mic)?,
            })
        }
        _ => Err(DecodeError::Invalid("SPNEGO: unknown token")),
    }
}

/// The hint token a server puts in its NEGOTIATE response: an InitialContextToken whose
/// NegTokenInit lists NTLMSSP only.
pub fn negotiate_hint() -> Vec<u8> {
    let mech_types = tlv(0x30, &tlv(0x06, OID_NTLMSSP));
    let init = tlv(0x30, &tlv(0xA0, &mech_types));
    let mut inner = tlv(0x06, OID_SPNEGO);
    inner.extend_from_slice(&tlv(0xA0, &init));
    tlv(0x60, &inner)
}

/// A NegTokenResp from the server.
pub fn neg_token_resp(
    state: NegState,
    supported_mech: Option<&[u8]>,
    response_token: Option<&[u8]>,
    mech_list_mic: Option<&[u8]>,
) -> Vec<u8> {
    let mut seq = tlv(0xA0, &tlv(0x0A, &[state as u8]));
    if let Some(m) = supported_mech {
        seq.extend_from_slice(&tlv(0xA1, &tlv(0x06, m)));
    }
    if let Some(t) = response_token {
        seq.extend_from_slice(&tlv(0xA2, &tlv(0x04, t)));
    }
    if let Some(m) = mech_list_mic {
        seq.extend_from_slice(&tlv(0xA3, &tlv(0x04, m)));
    }
    tlv(0xA1, &tlv(0x30, &seq))
}

/// The DER MechTypeList a client offering NTLMSSP only sends; its mechListMIC signs these
/// bytes.
pub fn ntlm_mech_types() -> Vec<u8> {
    tlv(0x30, &tlv(0x06, OID_NTLMSSP))
}

/// The client's first token: an InitialContextToken whose NegTokenInit offers NTLMSSP and
/// carries the NTLM NEGOTIATE as mechToken.
pub fn neg_token_init(mech_token: &[u8]) -> Vec<u8> {
    let mut seq = tlv(0xA0, &ntlm_mech_types());
    seq.extend_from_slice(&tlv(0xA2, &tlv(0x04, mech_token)));
    let init = tlv(0x30, &seq);
    let mut inner = tlv(0x06, OID_SPNEGO);
    inner.extend_from_slice(&tlv(0xA0, &init));
    tlv(0x60, &inner)
}

/// A client's NegTokenResp: no negState, the NTLM message and the mechListMIC.
pub fn client_neg_token_resp(response_token: &[u8], mech_list_mic: Option<&[u8]>) -> Vec<u8> {
    let mut seq = tlv(0xA2, &tlv(0x04, response_token));
    if let Some(m) = mech_list_mic {
        seq.extend_from_slice(&tlv(0xA3, &tlv(0x04, m)));
    }
    tlv(0xA1, &tlv(0x30, &seq))
}
