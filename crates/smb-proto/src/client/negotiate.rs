//! The client's NEGOTIATE for SMB 3.1.1 (MS-SMB2 3.2.4.2.2.2) and what the server's response
//! settles (3.2.5.2): the dialect, the preauth hash, the signing algorithm, the cipher.

use super::ClientError;
use crate::crypto::{Cipher, SigningAlgorithm};
use crate::msg::negotiate::{
    NegotiateContext, NegotiateRequest, NegotiateResponse, CAP_LARGE_MTU, DIALECT_311, HASH_SHA512,
    SECURITY_SIGNING_ENABLED, SECURITY_SIGNING_REQUIRED,
};

/// What the client offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientNegotiateConfig {
    pub client_guid: [u8; 16],
    /// SMB2_GLOBAL_CAP_* the client supports.
    pub capabilities: u32,
    pub signing_required: bool,
    /// Signing algorithms, most preferred first.
    pub signing: Vec<SigningAlgorithm>,
    /// Ciphers, most preferred first; empty offers no encryption.
    pub ciphers: Vec<Cipher>,
}

/// What the NEGOTIATE settled for the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientNegotiated {
    pub dialect: u16,
    pub server_guid: [u8; 16],
    /// The server's SMB2_GLOBAL_CAP_* bits.
    pub capabilities: u32,
    pub server_security_mode: u16,
    pub max_transact_size: u32,
    pub max_read_size: u32,
    pub max_write_size: u32,
    pub signing: SigningAlgorithm,
    pub cipher: Option<Cipher>,
}

impl ClientNegotiated {
    pub fn server_requires_signing(&self) -> bool {
        self.server_security_mode & SECURITY_SIGNING_REQUIRED != 0
    }
    pub fn large_mtu(&self) -> bool {
        self.capabilities & CAP_LARGE_MTU != 0
    }
    pub fn has(&self, cap: u32) -> bool {
        self.capabilities & cap != 0
    }
}

/// The NEGOTIATE request: 3.1.1 only, with the preauth (SHA-512, `salt`), encryption and
/// signing contexts.
pub fn negotiate_request<'a>(cfg: &ClientNegotiateConfig, salt: &'a [u8]) -> NegotiateRequest<'a> {
    let mut security_mode = SECURITY_SIGNING_ENABLED;
    if cfg.signing_required {
        security_mode |= SECURITY_SIGNING_REQUIRED;
    }
    let mut contexts = vec![NegotiateContext::PreauthIntegrity {
        hash_algorithms: vec![HASH_SHA512],
        salt,
    }];
    if !cfg.ciphers.is_empty() {
        contexts.push(NegotiateContext::Encryption {
            ciphers: cfg.ciphers.iter().map(|c| c.to_u16()).collect(),
        });
    }
    if !cfg.signing.is_empty() {
        contexts.push(NegotiateContext::Signing {
            algorithms: cfg.signing.iter().map(|a| a.to_u16()).collect(),
        });
    }
    NegotiateRequest {
        security_mode,
        capabilities: cfg.capabilities,
        client_guid: cfg.client_guid,
        dialects: vec![DIALECT_311],
        contexts,
    }
}

/// Checks the response against what was offered (MS-SMB2 3.2.5.2): dialect 3.1.1, exactly the
/// SHA-512 preauth hash, a cipher and signing algorithm among those offered. Without a signing
/// context the algorithm is AES-CMAC.
pub fn settle(
    cfg: &ClientNegotiateConfig,
    resp: &NegotiateResponse<'_>,
) -> Result<ClientNegotiated, ClientError> {
    if resp.dialect != DIALECT_311 {
        return Err(ClientError::Protocol("server did not choose SMB 3.1.1"));
    }
    let mut preauth = false;
    let mut cipher = None;
    let mut signing = SigningAlgorithm::AesCmac;
    for c in &resp.contexts {
        match c {
            NegotiateContext::PreauthIntegrity {
                hash_algorithms, ..
            } => {
                if hash_algorithms.as_slice() != [HASH_SHA512] {
                    return Err(ClientError::Protocol("preauth hash is not SHA-512 alone"));
                }
                preauth = true;
            }
            NegotiateContext::Encryption { ciphers } => match ciphers.as_slice() {
                [0] => cipher = None,
                [one] => {
                    let c = Cipher::from_u16(*one)
                        .filter(|c| cfg.ciphers.contains(c))
                        .ok_or(ClientError::Protocol("server chose a cipher not offered"))?;
                    cipher = Some(c);
                }
                _ => return Err(ClientError::Protocol("encryption context lists several")),
            },
            NegotiateContext::Signing { algorithms } => match algorithms.as_slice() {
                [one] => {
                    signing = SigningAlgorithm::from_u16(*one)
                        .filter(|a| cfg.signing.contains(a))
                        .ok_or(ClientError::Protocol(
                            "server chose a signing algorithm not offered",
                        ))?;
                }
                _ => return Err(ClientError::Protocol("signing context lists several")),
            },
            _ => {}
        }
    }
    if !preauth {
        return Err(ClientError::Protocol("no preauth integrity context"));
    }
    Ok(ClientNegotiated {
        dialect: resp.dialect,
        server_guid: resp.server_guid,
        capabilities: resp.capabilities,
        server_security_mode: resp.security_mode,
        max_transact_size: resp.max_transact_size,
        max_read_size: resp.max_read_size,
        max_write_size: resp.max_write_size,
        signing,
        cipher,
    })
}
