//! What a NEGOTIATE settles (MS-SMB2 3.3.5.4): the dialect (2.0.2, 2.1, 3.0, 3.0.2 or
//! 3.1.1, `dialect`), and for 3.1.1 the preauth hash, the cipher and the signing algorithm
//! from the negotiate contexts; for 3.0 and 3.0.2 AES-128-CCM when both sides have
//! SMB2_GLOBAL_CAP_ENCRYPTION; and the response to send.

use crate::crypto::{Cipher, SigningAlgorithm};
use crate::msg::negotiate::{
    NegotiateContext, NegotiateRequest, NegotiateResponse, CAP_ENCRYPTION, DIALECT_202,
    DIALECT_311, HASH_SHA512, SECURITY_SIGNING_ENABLED, SECURITY_SIGNING_REQUIRED,
};
use crate::server::dialect;
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
    /// Signing algorithms in the server's order of preference (3.1.1).
    pub signing: Vec<SigningAlgorithm>,
    /// The lowest and highest dialect accepted (0x0202 ..= 0x0311 for all of them).
    pub min_dialect: u16,
    pub max_dialect: u16,
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
    /// The Capabilities of the NEGOTIATE response (Connection.ServerCapabilities).
    pub server_capabilities: u32,
    /// The SecurityMode of the NEGOTIATE response.
    pub server_security_mode: u16,
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
    let chosen = dialect::select(&req.dialects, cfg.min_dialect, cfg.max_dialect)
        .ok_or(NtStatus::NOT_SUPPORTED)?;
    if chosen != DIALECT_311 {
        return Ok(negotiate_older(
            req,
            cfg,
            chosen,
            system_time,
            security_buffer,
        ));
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
    let security_mode = security_mode(cfg);
    // SMB2_GLOBAL_CAP_ENCRYPTION belongs to 3.0.x; 3.1.1 negotiates ciphers by context.
    let offered = dialect::capabilities(DIALECT_311, cfg.capabilities, false);
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
            server_capabilities: offered,
            server_security_mode: security_mode,
        },
        resp,
    ))
}

fn security_mode(cfg: &NegotiateConfig) -> u16 {
    if cfg.signing_required {
        SECURITY_SIGNING_ENABLED | SECURITY_SIGNING_REQUIRED
    } else {
        SECURITY_SIGNING_ENABLED
    }
}

/// 2.0.2, 2.1, 3.0 and 3.0.2: no negotiate contexts; the signing algorithm follows from the
/// dialect; 3.0 and 3.0.2 encrypt with AES-128-CCM when the server has it and the client
/// offers SMB2_GLOBAL_CAP_ENCRYPTION.
fn negotiate_older<'a>(
    req: &NegotiateRequest<'_>,
    cfg: &NegotiateConfig,
    chosen: u16,
    system_time: u64,
    security_buffer: &'a [u8],
) -> (Negotiated, NegotiateResponse<'a>) {
    let cipher = (dialect::is_smb3(chosen)
        && req.capabilities & CAP_ENCRYPTION != 0
        && cfg.ciphers.contains(&Cipher::Aes128Ccm))
    .then_some(Cipher::Aes128Ccm);
    let offered = dialect::capabilities(chosen, cfg.capabilities, cipher.is_some());
    let security_mode = security_mode(cfg);
    let resp = NegotiateResponse {
        security_mode,
        dialect: chosen,
        server_guid: cfg.server_guid,
        capabilities: offered,
        max_transact_size: dialect::max_io(chosen, cfg.max_transact_size),
        max_read_size: dialect::max_io(chosen, cfg.max_read_size),
        max_write_size: dialect::max_io(chosen, cfg.max_write_size),
        system_time,
        server_start_time: cfg.server_start_time,
        security_buffer,
        contexts: Vec::new(),
    };
    let n = Negotiated {
        dialect: chosen,
        client_guid: req.client_guid,
        client_capabilities: req.capabilities,
        client_security_mode: req.security_mode,
        cipher,
        signing: dialect::fixed_signing(chosen),
        capabilities: offered & req.capabilities,
        server_capabilities: offered,
        server_security_mode: security_mode,
    };
    (n, resp)
}

/// Whether an FSCTL_VALIDATE_NEGOTIATE_INFO request matches the NEGOTIATE (MS-SMB2
/// 3.3.5.15.12): ClientGuid, SecurityMode and Capabilities exactly, and the dialect its list
/// selects (within `min..=max`) is the connection's. A 3.1.1 connection (whose NEGOTIATE the
/// preauth hash protects) only needs its dialect in the list.
pub fn validates(
    n: &Negotiated,
    v: &crate::msg::ioctl::ValidateNegotiateInfo,
    min: u16,
    max: u16,
) -> bool {
    let same = v.guid == n.client_guid
        && v.security_mode == n.client_security_mode
        && v.capabilities == n.client_capabilities;
    if n.dialect == DIALECT_311 {
        return same && v.dialects.contains(&n.dialect);
    }
    same && dialect::select(&v.dialects, min, max) == Some(n.dialect)
}

/// The connection an SMB1 NEGOTIATE offering only "SMB 2.002" settles at 2.0.2 (MS-SMB2
/// 3.3.5.3.1): no ClientGuid, capabilities or security mode are known from the client.
pub fn negotiate_smb1_202<'a>(
    cfg: &NegotiateConfig,
    system_time: u64,
    security_buffer: &'a [u8],
) -> (Negotiated, NegotiateResponse<'a>) {
    let req = NegotiateRequest {
        dialects: vec![DIALECT_202],
        ..NegotiateRequest::default()
    };
    negotiate_older(&req, cfg, DIALECT_202, system_time, security_buffer)
}

/// The SMB2 NEGOTIATE response to an SMB1 multi-protocol NEGOTIATE that offered "SMB 2.???":
/// dialect 0x02FF, no contexts (MS-SMB2 3.3.5.3.1). It goes out with MessageId 0.
pub fn wildcard_response<'a>(
    cfg: &NegotiateConfig,
    system_time: u64,
    security_buffer: &'a [u8],
) -> NegotiateResponse<'a> {
    NegotiateResponse {
        security_mode: security_mode(cfg),
        dialect: crate::msg::negotiate::DIALECT_WILDCARD,
        server_guid: cfg.server_guid,
        capabilities: dialect::capabilities(DIALECT_311, cfg.capabilities, false),
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
    use crate::msg::Message;

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
            min_dialect: DIALECT_202,
            max_dialect: DIALECT_311,
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

    fn request(dialects: &[u16], capabilities: u32) -> NegotiateRequest<'static> {
        NegotiateRequest {
            security_mode: 1,
            capabilities,
            client_guid: [3; 16],
            dialects: dialects.to_vec(),
            contexts: Vec::new(),
        }
    }

    #[test]
    fn older_dialects_settle_without_contexts() {
        use crate::msg::negotiate::*;
        let mut cfg = config();
        cfg.capabilities =
            CAP_DFS | CAP_LEASING | CAP_LARGE_MTU | CAP_MULTI_CHANNEL | CAP_ENCRYPTION;
        cfg.max_read_size = 1 << 23;
        cfg.ciphers = vec![Cipher::Aes128Gcm, Cipher::Aes128Ccm];
        let all = CAP_DFS | CAP_LEASING | CAP_LARGE_MTU | CAP_MULTI_CHANNEL | CAP_ENCRYPTION;
        let cases = [
            (
                DIALECT_202,
                SigningAlgorithm::HmacSha256,
                None,
                CAP_DFS,
                65536,
            ),
            (
                DIALECT_210,
                SigningAlgorithm::HmacSha256,
                None,
                CAP_DFS | CAP_LEASING | CAP_LARGE_MTU,
                1 << 23,
            ),
            (
                DIALECT_300,
                SigningAlgorithm::AesCmac,
                Some(Cipher::Aes128Ccm),
                all,
                1 << 23,
            ),
            (
                DIALECT_302,
                SigningAlgorithm::AesCmac,
                Some(Cipher::Aes128Ccm),
                all,
                1 << 23,
            ),
        ];
        for (d, signing, cipher, caps, max_read) in cases {
            let req = request(
                &[DIALECT_202, DIALECT_210, DIALECT_300, DIALECT_302][..],
                all,
            );
            let req = NegotiateRequest {
                dialects: req.dialects.into_iter().filter(|x| *x <= d).collect(),
                ..req
            };
            let (n, resp) = negotiate(&req, &cfg, &[], 0, &[]).unwrap();
            assert_eq!((n.dialect, resp.dialect), (d, d));
            assert_eq!(n.signing, signing, "{d:#x}");
            assert_eq!(n.cipher, cipher, "{d:#x}");
            assert_eq!(resp.capabilities, caps, "{d:#x}");
            assert_eq!(n.server_capabilities, caps);
            assert_eq!(resp.max_read_size, max_read, "{d:#x}");
            assert!(resp.contexts.is_empty());
            // The response goes out without contexts and decodes back the same.
            let mut out = Vec::new();
            resp.encode(&mut out);
            let msg = out_with_header(&out);
            let back = NegotiateResponse::decode(&msg).unwrap();
            assert_eq!(back.dialect, d);
            assert!(back.contexts.is_empty());
        }
        // 3.0 without the client's ENCRYPTION capability, or a server without AES-128-CCM:
        // no cipher and no ENCRYPTION in the answer.
        let (n, resp) =
            negotiate(&request(&[DIALECT_300], CAP_LARGE_MTU), &cfg, &[], 0, &[]).unwrap();
        assert_eq!(n.cipher, None);
        assert_eq!(resp.capabilities & CAP_ENCRYPTION, 0);
        assert_eq!(n.capabilities, CAP_LARGE_MTU);
        let mut gcm_only = cfg.clone();
        gcm_only.ciphers = vec![Cipher::Aes128Gcm];
        let (n, resp) = negotiate(&request(&[DIALECT_302], all), &gcm_only, &[], 0, &[]).unwrap();
        assert_eq!(n.cipher, None);
        assert_eq!(resp.capabilities & CAP_ENCRYPTION, 0);
        // A minimum above what the client offers: NOT_SUPPORTED.
        let mut strict = cfg.clone();
        strict.min_dialect = DIALECT_300;
        assert_eq!(
            negotiate(
                &request(&[DIALECT_202, DIALECT_210], all),
                &strict,
                &[],
                0,
                &[]
            )
            .map(|r| r.0),
            Err(NtStatus::NOT_SUPPORTED)
        );
        // A 3.1.1 client below a maximum of 3.0.2 gets 3.0.2 and no contexts.
        let mut capped = cfg.clone();
        capped.max_dialect = DIALECT_302;
        let (n, resp) = negotiate(
            &request(&[DIALECT_300, DIALECT_302, DIALECT_311], all),
            &capped,
            &[],
            0,
            &[],
        )
        .unwrap();
        assert_eq!(n.dialect, DIALECT_302);
        assert!(resp.contexts.is_empty());
        // SMB1 "SMB 2.002" only: 2.0.2 with nothing known of the client.
        let (n, resp) = negotiate_smb1_202(&cfg, 0, &[]);
        assert_eq!((n.dialect, resp.dialect), (DIALECT_202, DIALECT_202));
        assert_eq!((n.client_guid, n.client_capabilities), ([0; 16], 0));
        assert_eq!(resp.capabilities, CAP_DFS);
    }

    #[test]
    fn validate_negotiate_info_matches_exactly() {
        use crate::msg::ioctl::ValidateNegotiateInfo;
        use crate::msg::negotiate::*;
        let cfg = config();
        let offered = [DIALECT_202, DIALECT_210, DIALECT_300];
        let (n, _) = negotiate(&request(&offered, CAP_LARGE_MTU), &cfg, &[], 0, &[]).unwrap();
        assert_eq!(n.dialect, DIALECT_300);
        let good = ValidateNegotiateInfo {
            capabilities: CAP_LARGE_MTU,
            guid: [3; 16],
            security_mode: 1,
            dialects: offered.to_vec(),
        };
        let (min, max) = (cfg.min_dialect, cfg.max_dialect);
        assert!(validates(&n, &good, min, max));
        let mut v = good.clone();
        v.capabilities |= CAP_ENCRYPTION;
        assert!(!validates(&n, &v, min, max));
        let mut v = good.clone();
        v.guid[0] ^= 1;
        assert!(!validates(&n, &v, min, max));
        let mut v = good.clone();
        v.security_mode = 2;
        assert!(!validates(&n, &v, min, max));
        // A downgrade: the list held 3.0.2, which the connection would have chosen.
        let mut v = good.clone();
        v.dialects.push(DIALECT_302);
        assert!(!validates(&n, &v, min, max));
        let mut v = good.clone();
        v.dialects = vec![DIALECT_202];
        assert!(!validates(&n, &v, min, max));
    }

    /// A response body behind a blank response header, as `decode` expects.
    fn out_with_header(body: &[u8]) -> Vec<u8> {
        let mut m = vec![0u8; crate::HEADER_LEN];
        m[..4].copy_from_slice(&crate::header::PROTOCOL_ID);
        m[4] = 64;
        m.extend_from_slice(body);
        m
    }
}
