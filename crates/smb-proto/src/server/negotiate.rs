//! What a NEGOTIATE settles (MS-SMB2 3.3.5.4) for a server that speaks SMB 3.1.1 only: the
//! dialect, the preauth hash, the cipher and the signing algorithm, and the response to send.

use crate::crypto::{Cipher, SigningAlgorithm};
use crate::msg::negotiate::{
    NegotiateContext, NegotiateRequest, NegotiateResponse, DIALECT_311, HASH_SHA512,
    SECURITY_SIGNING_ENABLED, SECURITY_SIGNING_REQUIRED,
};
use crate::status::NtStatus;

/// The server's side of the negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegotiateConfig {
    pub server_guid: [u8; 16],
    /// SMB2_GLOBAL_CAP_* the server offers (DFS, LEASING, LARGE_MTU, MULTI_CHANNEL, ...).
    pub capabilities: u32,
    pub max_transact_size: u32,
    pub max_read_size: u32,
    pub max_write_size: u32,
    /// FILETIME of the server's start, or 0.
    pub server_start_time: u64,
    pub signing_required: bool,
    /// Ciphers in the server's order of preference; empty disables encryption.
    pub ciphers: Vec<Cipher>,
    /// Signing algorithms in the server's order of preference.
    pub signing: Vec<SigningAlgorithm>,
}

/// The outcome for the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub dialect: u16,
    pub client_guid: [u8; 16],
    pub client_capabilities: u32,
    pub client_security_mode: u16,
    /// None when client and server share no cipher.
    pub cipher: Option<Cipher>,
    pub signing: SigningAlgorithm,
    /// Capabilities granted: the server's, masked by the client's.
    pub capabilities: u32,
}

/// Settles the negotiation and fills in the response. `salt` (32 random bytes is usual),
/// `system_time` (FILETIME) and `security_buffer` (the SPNEGO hint) are the caller's.
pub fn negotiate<'a>(
    req: &NegotiateRequest<'_>,
    cfg: &NegotiateConfig,
    salt: &'a [u8],
    system_time: u64,
    security_buffer: &'a [u8],
) -> Result<(Negotiated, NegotiateResponse<'a>), NtStatus> {
    if !req.offers_311() {
        return Err(NtStatus::NOT_SUPPORTED);
    }
    let mut hashes = None;
    let mut ciphers = None;
    let mut signing = None;
    for c in &req.contexts {
        match c {
            NegotiateContext::PreauthIntegrity {
                hash_algorithms, ..
            } => hashes = Some(hash_algorithms),
            NegotiateContext::Encryption { ciphers: l } => ciphers = Some(l),
            NegotiateContext::Signing { algorithms } => signing = Some(algorithms),
            _ => {}
        }
    }
    let hashes = hashes.ok_or(NtStatus::INVALID_PARAMETER)?;
    if !hashes.contains(&HASH_SHA512) {
        return Err(NtStatus::NO_PREAUTH_INTEGRITY_HASH_OVERLAP);
    }
    let cipher = ciphers.and_then(|offered| {
        cfg.ciphers
            .iter()
            .copied()
            .find(|c| offered.contains(&c.to_u16()))
    });
    let sign_alg = signing
        .and_then(|offered| {
            cfg.signing
                .iter()
                .copied()
                .find(|a| offered.contains(&a.to_u16()))
        })
        .unwrap_or(SigningAlgorithm::AesCmac);

    let mut contexts = vec![NegotiateContext::PreauthIntegrity {
        hash_algorithms: vec![HASH_SHA512],
        salt,
    }];
    if ciphers.is_some() {
        contexts.push(NegotiateContext::Encryption {
            ciphers: vec![cipher.map_or(0, Cipher::to_u16)],
        });
    }
    if signing.is_some() {
        contexts.push(NegotiateContext::Signing {
            algorithms: vec![sign_alg.to_u16()],
        });
    }
    let mut security_mode = SECURITY_SIGNING_ENABLED;
    if cfg.signing_required {
        security_mode |= SECURITY_SIGNING_REQUIRED;
    }
    // SMB2_GLOBAL_CAP_ENCRYPTION belongs to 3.0.x; 3.1.1 negotiates ciphers by context.
    let offered = cfg.capabilities & !crate::msg::negotiate::CAP_ENCRYPTION;
    let capabilities = offered & req.capabilities;
    let resp = NegotiateResponse {
        security_mode,
        dialect: DIALECT_311,
        server_guid: cfg.server_guid,
        capabilities: offered,
        max_transact_size: cfg.max_transact_size,
        max_read_size: cfg.max_read_size,
        max_write_size: cfg.max_write_size,
        system_time,
        server_start_time: cfg.server_start_time,
        security_buffer,
        contexts,
    };
    Ok((
        Negotiated {
            dialect: DIALECT_311,
            client_guid: req.client_guid,
            client_capabilities: req.capabilities,
            client_security_mode: req.security_mode,
            cipher,
            signing: sign_alg,
            capabilities,
        },
        resp,
    ))
}

/// The SMB2 NEGOTIATE response to an SMB1 multi-protocol NEGOTIATE that offered "SMB 2.???":
/// dialect 0x02FF, no contexts (MS-SMB2 3.3.5.3.1). It goes out with MessageId 0.
pub fn wildcard_response<'a>(
    cfg: &NegotiateConfig,
    system_time: u64,
    security_buffer: &'a [u8],
) -> NegotiateResponse<'a> {
    let mut security_mode = SECURITY_SIGNING_ENABLED;
    if cfg.signing_required {
        security_mode |= SECURITY_SIGNING_REQUIRED;
    }
    NegotiateResponse {
        security_mode,
        dialect: crate::msg::negotiate::DIALECT_WILDCARD,
        server_guid: cfg.server_guid,
        capabilities: cfg.capabilities,
        max_transact_size: cfg.max_transact_size,
        max_read_size: cfg.max_read_size,
        max_write_size: cfg.max_write_size,
        system_time,
        server_start_time: cfg.server_start_time,
        security_buffer,
        contexts: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NegotiateConfig {
        NegotiateConfig {
            server_guid: [7; 16],
            capabilities: 0,
            max_transact_size: 65536,
            max_read_size: 65536,
            max_write_size: 65536,
            server_start_time: 0,
            signing_required: false,
            ciphers: vec![Cipher::Aes128Gcm],
            signing: vec![
                SigningAlgorithm::AesGmac,
                SigningAlgorithm::AesCmac,
                SigningAlgorithm::HmacSha256,
            ],
        }
    }

    /// The algorithm chosen for a client offering `offer` (None: no SIGNING_CAPABILITIES),
    /// and the algorithms the response's signing context lists.
    fn choose(offer: Option<Vec<u16>>) -> (SigningAlgorithm, Option<Vec<u16>>) {
        let salt = [0u8; 32];
        let mut contexts = vec![NegotiateContext::PreauthIntegrity {
            hash_algorithms: vec![HASH_SHA512],
            salt: &salt,
        }];
        if let Some(algorithms) = offer {
            contexts.push(NegotiateContext::Signing { algorithms });
        }
        let req = NegotiateRequest {
            security_mode: 1,
            capabilities: 0,
            client_guid: [1; 16],
            dialects: vec![DIALECT_311],
            contexts,
        };
        let (n, resp) = negotiate(&req, &config(), &salt, 0, &[]).unwrap();
        let answered = resp.contexts.iter().find_map(|c| match c {
            NegotiateContext::Signing { algorithms } => Some(algorithms.clone()),
            _ => None,
        });
        (n.signing, answered)
    }

    #[test]
    fn signing_is_the_servers_first_choice_the_client_offers() {
        use SigningAlgorithm::*;
        // HMAC-SHA256 alone (smbtorture's signing-hmac-sha-256): HMAC-SHA256.
        assert_eq!(choose(Some(vec![0])), (HmacSha256, Some(vec![0])));
        // The server's order decides, not the client's.
        assert_eq!(choose(Some(vec![0, 1])), (AesCmac, Some(vec![1])));
        assert_eq!(choose(Some(vec![0, 1, 2])), (AesGmac, Some(vec![2])));
        assert_eq!(choose(Some(vec![1, 2])), (AesGmac, Some(vec![2])));
        // Nothing the server knows: AES-CMAC, the 3.x default.
        assert_eq!(choose(Some(vec![9])), (AesCmac, Some(vec![1])));
        // No signing context: AES-CMAC and no context in the answer.
        assert_eq!(choose(None), (AesCmac, None));
    }
}
