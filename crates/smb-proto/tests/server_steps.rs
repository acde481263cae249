//! The server-side steps (negotiate selection, SESSION_SETUP authentication) replayed against
//! the published Windows sign-in: given the Windows server's inputs, they produce its bytes.

mod common;

use common::captures as cap;
use common::{hex, hex16};
use smb_proto::auth::ntlm_server::{nt_hash, ChallengeParams};
use smb_proto::crypto::{Cipher, PreauthHash, SessionKeys, SigningAlgorithm};
use smb_proto::msg::negotiate::{NegotiateContext, CTX_SIGNING};
use smb_proto::msg::{
    Message, NegotiateRequest, NegotiateResponse, SessionSetupRequest, SessionSetupResponse,
};
use smb_proto::server::{negotiate, AuthStep, NegotiateConfig, SessionAuth};
use smb_proto::{NtStatus, HEADER_LEN};

fn config() -> NegotiateConfig {
    let resp = hex(cap::NEGOTIATE_RESP);
    let r = NegotiateResponse::decode(&resp).unwrap();
    NegotiateConfig {
        server_guid: r.server_guid,
        capabilities: 0x2F,
        max_transact_size: 0x80_0000,
        max_read_size: 0x80_0000,
        max_write_size: 0x80_0000,
        server_start_time: r.server_start_time,
        signing_required: false,
        min_dialect: 0x0202,
        max_dialect: 0x0311,
        ciphers: vec![Cipher::Aes128Gcm, Cipher::Aes128Ccm],
        signing: vec![SigningAlgorithm::AesGmac, SigningAlgorithm::AesCmac],
    }
}

#[test]
fn negotiate_answers_like_the_windows_server() {
    let req = hex(cap::NEGOTIATE_REQ);
    let n = NegotiateRequest::decode(&req).unwrap();
    let resp = hex(cap::NEGOTIATE_RESP);
    let theirs = NegotiateResponse::decode(&resp).unwrap();
    let NegotiateContext::PreauthIntegrity { salt, .. } = &theirs.contexts[0] else {
        panic!()
    };
    let (got, ours) = negotiate(
        &n,
        &config(),
        salt,
        theirs.system_time,
        theirs.security_buffer,
    )
    .unwrap();
    assert_eq!(got.cipher, Some(Cipher::Aes128Gcm));
    // The client sent no SIGNING_CAPABILITIES, so AES-CMAC.
    assert_eq!(got.signing, SigningAlgorithm::AesCmac);
    let mut body = Vec::new();
    ours.encode(&mut body);
    assert_eq!(body, resp[HEADER_LEN..]);
}

#[test]
fn negotiate_choices_and_refusals() {
    let salt = [0u8; 32];
    let mut n = NegotiateRequest {
        security_mode: 1,
        capabilities: 0x7F,
        client_guid: [1; 16],
        dialects: vec![0x0311],
        contexts: vec![
            NegotiateContext::PreauthIntegrity {
                hash_algorithms: vec![1],
                salt: &salt,
            },
            NegotiateContext::Encryption {
                ciphers: vec![4, 1],
            },
            NegotiateContext::Signing {
                algorithms: vec![1, 2],
            },
        ],
    };
    let (g, r) = negotiate(&n, &config(), &salt, 0, &[]).unwrap();
    assert_eq!(g.cipher, Some(Cipher::Aes128Ccm));
    assert_eq!(g.signing, SigningAlgorithm::AesGmac);
    assert!(r.contexts.iter().any(|c| c.context_type() == CTX_SIGNING));

    n.contexts[1] = NegotiateContext::Encryption { ciphers: vec![4] };
    let (g, r) = negotiate(&n, &config(), &salt, 0, &[]).unwrap();
    assert_eq!(g.cipher, None);
    assert!(r
        .contexts
        .contains(&NegotiateContext::Encryption { ciphers: vec![0] }));

    n.contexts[0] = NegotiateContext::PreauthIntegrity {
        hash_algorithms: vec![2],
        salt: &salt,
    };
    assert_eq!(
        negotiate(&n, &config(), &salt, 0, &[]).unwrap_err(),
        NtStatus::NO_PREAUTH_INTEGRITY_HASH_OVERLAP
    );
    n.contexts.remove(0);
    assert_eq!(
        negotiate(&n, &config(), &salt, 0, &[]).unwrap_err(),
        NtStatus::INVALID_PARAMETER
    );
    // 3.0.2 is spoken now, unless the server's range starts above it.
    n.dialects = vec![0x0302];
    assert_eq!(
        negotiate(&n, &config(), &salt, 0, &[]).unwrap().0.dialect,
        0x0302
    );
    let mut only_311 = config();
    only_311.min_dialect = 0x0311;
    assert_eq!(
        negotiate(&n, &only_311, &salt, 0, &[]).unwrap_err(),
        NtStatus::NOT_SUPPORTED
    );
    n.dialects = vec![0x0222];
    assert_eq!(
        negotiate(&n, &config(), &salt, 0, &[]).unwrap_err(),
        NtStatus::NOT_SUPPORTED
    );
}

#[test]
fn session_auth_answers_like_the_windows_server_and_keys_follow() {
    let params = ChallengeParams {
        server_challenge: hex(cap::SERVER_CHALLENGE).try_into().unwrap(),
        timestamp: u64::from_le_bytes(hex("A1A1F5ADCBAED001").try_into().unwrap()),
        nb_domain: "SUT311".into(),
        nb_computer: "SUT311".into(),
        dns_domain: "SUT311".into(),
        dns_computer: "SUT311".into(),
        version: [0x0A, 0x00, 0x92, 0x27, 0, 0, 0, 0x0F],
    };
    let mut auth = SessionAuth::new(params);
    let mut preauth = PreauthHash::default();
    preauth.update(&hex(cap::NEGOTIATE_REQ));
    preauth.update(&hex(cap::NEGOTIATE_RESP));

    let req1 = hex(cap::SESSION_SETUP_REQ1);
    preauth.update(&req1);
    let step = auth
        .step(
            SessionSetupRequest::decode(&req1).unwrap().security_buffer,
            |_, _| None,
        )
        .unwrap();
    let AuthStep::Continue(token) = step else {
        panic!("expected Continue")
    };
    let resp1 = hex(cap::SESSION_SETUP_RESP1);
    assert_eq!(
        token,
        SessionSetupResponse::decode(&resp1)
            .unwrap()
            .security_buffer
    );
    preauth.update(&resp1);

    let req2 = hex(cap::SESSION_SETUP_REQ2);
    preauth.update(&req2);
    let step = auth
        .step(
            SessionSetupRequest::decode(&req2).unwrap().security_buffer,
            |_, _| Some(nt_hash(cap::PASSWORD)),
        )
        .unwrap();
    let AuthStep::Done { session, token } = step else {
        panic!("expected Done")
    };
    assert_eq!(
        token,
        SessionSetupResponse::decode(&hex(cap::SESSION_SETUP_RESP2))
            .unwrap()
            .security_buffer
    );
    let keys = SessionKeys::derive_311(&session.session_key(), &preauth, Some(Cipher::Aes128Gcm));
    assert_eq!(keys.signing, hex16(cap::SIGNING_KEY));

    // A third step is out of order.
    assert!(auth
        .step(
            SessionSetupRequest::decode(&req2).unwrap().security_buffer,
            |_, _| None
        )
        .is_err());
}

#[test]
fn wildcard_response_for_smb1_clients() {
    let r = smb_proto::server::wildcard_response(&config(), 5, &[]);
    let mut m = vec![0xFE, b'S', b'M', b'B', 64, 0];
    m.resize(64, 0);
    r.encode(&mut m);
    let back = NegotiateResponse::decode(&m).unwrap();
    assert_eq!(back.dialect, 0x02FF);
    assert!(back.contexts.is_empty());
    assert_eq!(back.system_time, 5);
}

/// A client that prefers Kerberos: its optimistic token is not NTLM, so the server names
/// NTLMSSP with negState request-mic, then takes the NTLM exchange in NegTokenResps and
/// insists on the mechListMIC.
#[test]
fn ntlm_as_second_choice_requests_the_mic() {
    use smb_proto::auth::der::tlv;
    use smb_proto::auth::spnego::{parse_client_token, ClientToken, OID_NTLMSSP, OID_SPNEGO};
    const OID_KRB5: &[u8] = &[0x2A, 0x86, 0x48, 0x86, 0xF7, 0x12, 0x01, 0x02, 0x02];
    let mut oids = tlv(0x06, OID_KRB5);
    oids.extend(tlv(0x06, OID_NTLMSSP));
    let mut seq = tlv(0xA0, &tlv(0x30, &oids));
    seq.extend(tlv(0xA2, &tlv(0x04, b"\x60\x05not-ntlm")));
    let mut inner = tlv(0x06, OID_SPNEGO);
    inner.extend(tlv(0xA0, &tlv(0x30, &seq)));
    let init = tlv(0x60, &inner);

    let mut auth = SessionAuth::new(ChallengeParams {
        server_challenge: [7; 8],
        timestamp: 0,
        nb_domain: "D".into(),
        nb_computer: "C".into(),
        dns_domain: "d".into(),
        dns_computer: "c".into(),
        version: [0; 8],
    });
    let AuthStep::Continue(first) = auth.step(&init, |_, _| None).unwrap() else {
        panic!()
    };
    let ClientToken::Resp {
        neg_state,
        supported_mech,
        response_token,
        ..
    } = parse_client_token(&first).unwrap()
    else {
        panic!()
    };
    assert_eq!(neg_state, Some(3), "request-mic");
    assert_eq!(supported_mech, Some(OID_NTLMSSP));
    assert_eq!(response_token, None);

    // Now the NTLM NEGOTIATE in a NegTokenResp: accept-incomplete with the CHALLENGE.
    let req1 = hex(cap::SESSION_SETUP_REQ1);
    let t1 =
        parse_client_token(SessionSetupRequest::decode(&req1).unwrap().security_buffer).unwrap();
    let resp = tlv(0xA1, &tlv(0x30, &tlv(0xA2, &tlv(0x04, t1.ntlm().unwrap()))));
    let AuthStep::Continue(second) = auth.step(&resp, |_, _| None).unwrap() else {
        panic!()
    };
    let ClientToken::Resp {
        neg_state,
        response_token,
        ..
    } = parse_client_token(&second).unwrap()
    else {
        panic!()
    };
    assert_eq!(neg_state, Some(1));
    assert!(response_token.unwrap().starts_with(b"NTLMSSP\0\x02"));

    // An AUTHENTICATE without a mechListMIC is refused before NTLM is even checked.
    let req2 = hex(cap::SESSION_SETUP_REQ2);
    let t2 =
        parse_client_token(SessionSetupRequest::decode(&req2).unwrap().security_buffer).unwrap();
    let bare = tlv(0xA1, &tlv(0x30, &tlv(0xA2, &tlv(0x04, t2.ntlm().unwrap()))));
    assert_eq!(
        auth.clone()
            .step(&bare, |_, _| Some(nt_hash(cap::PASSWORD)))
            .unwrap_err(),
        smb_proto::auth::AuthError::BadMic
    );
}
