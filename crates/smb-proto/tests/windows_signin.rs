//! The whole published Windows SMB 3.1.1 sign-in (see `common/captures.rs`) through this crate,
//! as a server would run it: decode each message, answer NTLM inside SPNEGO with the same
//! challenge inputs the Windows server used, verify the client, and check that every byte the
//! server side produces equals what the Windows server sent.

mod common;

use common::captures as cap;
use common::{hex, hex16};
use smb_proto::auth::ntlm::{flags, NegotiateMessage};
use smb_proto::auth::ntlm_server::{nt_hash, ChallengeParams, NtlmServer, NtlmSession};
use smb_proto::auth::spnego::{
    neg_token_resp, parse_client_token, ClientToken, NegState, OID_NTLMSSP,
};
use smb_proto::msg::negotiate::{NegotiateContext, DIALECT_311};
use smb_proto::msg::{
    Message, NegotiateRequest, NegotiateResponse, SessionSetupRequest, SessionSetupResponse,
};
use smb_proto::{Command, Header, HEADER_LEN};

fn params(challenge: &str, timestamp: &str) -> ChallengeParams {
    ChallengeParams {
        server_challenge: hex(challenge).try_into().unwrap(),
        timestamp: u64::from_le_bytes(hex(timestamp).try_into().unwrap()),
        nb_domain: "SUT311".into(),
        nb_computer: "SUT311".into(),
        dns_domain: "SUT311".into(),
        dns_computer: "SUT311".into(),
        // Windows 10.0 build 10130, NTLM revision 15, as the capture shows.
        version: [0x0A, 0x00, 0x92, 0x27, 0, 0, 0, 0x0F],
    }
}

#[test]
fn negotiate_messages_decode_and_the_response_re_encodes_byte_for_byte() {
    let req = hex(cap::NEGOTIATE_REQ);
    let h = Header::decode(&req).unwrap();
    assert_eq!(h.command, Command::Negotiate);
    let n = NegotiateRequest::decode(&req).unwrap();
    assert_eq!(n.dialects, vec![0x0202, 0x0210, 0x0300, 0x0302, 0x0311]);
    assert_eq!(n.capabilities, 0x3F);
    assert!(n.offers_311());
    match &n.contexts[..] {
        [NegotiateContext::PreauthIntegrity {
            hash_algorithms,
            salt,
        }, NegotiateContext::Encryption { ciphers }] => {
            assert_eq!(hash_algorithms, &vec![1]);
            assert_eq!(salt.len(), 32);
            assert_eq!(ciphers, &vec![2, 1]);
        }
        other => panic!("contexts: {other:?}"),
    }
    let mut again = req[..HEADER_LEN].to_vec();
    n.encode(&mut again);
    assert_eq!(again, req);

    let resp = hex(cap::NEGOTIATE_RESP);
    let r = NegotiateResponse::decode(&resp).unwrap();
    assert_eq!(r.dialect, DIALECT_311);
    assert_eq!(r.security_buffer.len(), 0x140);
    assert_eq!(r.contexts.len(), 2);
    let mut again = resp[..HEADER_LEN].to_vec();
    r.encode(&mut again);
    assert_eq!(again, resp);
}

fn sign_in(
    req1: &str,
    resp1: &str,
    req2: &str,
    resp2: &str,
    challenge: &str,
    timestamp: &str,
) -> NtlmSession {
    // Round one: NegTokenInit with the NTLM NEGOTIATE.
    let req1 = hex(req1);
    let ss1 = SessionSetupRequest::decode(&req1).unwrap();
    let ClientToken::Init {
        mech_types,
        mech_types_der,
        mech_token,
        ..
    } = parse_client_token(ss1.security_buffer).unwrap()
    else {
        panic!("not a NegTokenInit")
    };
    assert_eq!(mech_types, vec![OID_NTLMSSP]);
    let neg = mech_token.unwrap();
    assert_eq!(NegotiateMessage::decode(neg).unwrap().flags, 0xE208_8297);

    let mut server = NtlmServer::new(params(challenge, timestamp));
    let challenge_msg = server.negotiate(neg).unwrap();
    let token = neg_token_resp(
        NegState::AcceptIncomplete,
        Some(OID_NTLMSSP),
        Some(&challenge_msg),
        None,
    );
    let resp1 = hex(resp1);
    let sresp1 = SessionSetupResponse::decode(&resp1).unwrap();
    assert_eq!(
        token, sresp1.security_buffer,
        "CHALLENGE in SPNEGO differs from Windows'"
    );
    let mut body = Vec::new();
    SessionSetupResponse {
        session_flags: 0,
        security_buffer: &token,
    }
    .encode(&mut body);
    assert_eq!(body, resp1[HEADER_LEN..]);

    // Round two: NegTokenResp with the AUTHENTICATE and the client's mechListMIC.
    let req2 = hex(req2);
    let ss2 = SessionSetupRequest::decode(&req2).unwrap();
    let t2 = parse_client_token(ss2.security_buffer).unwrap();
    let auth = t2.ntlm().unwrap();
    let session = server
        .authenticate(auth, |user, domain| {
            assert_eq!((user, domain), ("administrator", "SUT311"));
            Some(nt_hash(cap::PASSWORD))
        })
        .unwrap();
    assert_ne!(session.flags & flags::KEY_EXCH, 0);
    assert!(session.verify_client_mic(mech_types_der, t2.mech_list_mic().unwrap()));
    assert!(!session.verify_client_mic(b"\x30\x00", t2.mech_list_mic().unwrap()));

    let mic = session.server_mic(mech_types_der);
    let token = neg_token_resp(NegState::AcceptCompleted, None, None, Some(&mic));
    let resp2 = hex(resp2);
    assert_eq!(
        token,
        SessionSetupResponse::decode(&resp2)
            .unwrap()
            .security_buffer
    );
    session
}

#[test]
fn main_channel_sign_in_reproduces_the_windows_server() {
    assert_eq!(nt_hash(cap::PASSWORD), hex16(cap::NT_HASH));
    let s = sign_in(
        cap::SESSION_SETUP_REQ1,
        cap::SESSION_SETUP_RESP1,
        cap::SESSION_SETUP_REQ2,
        cap::SESSION_SETUP_RESP2,
        cap::SERVER_CHALLENGE,
        "A1A1F5ADCBAED001",
    );
    assert_eq!(s.keys.session_base_key, hex16(cap::KEY_EXCHANGE_KEY));
    assert_eq!(s.session_key(), hex16(cap::SESSION_KEY));
    assert_eq!(s.gss.0.client_sign, hex16(cap::CLIENT_SIGNING_KEY_NTLM));
    assert_eq!(s.gss.0.server_sign, hex16(cap::SERVER_SIGNING_KEY_NTLM));
    assert_eq!(s.gss.0.client_seal, hex16(cap::CLIENT_SEALING_KEY_NTLM));
    assert_eq!(s.gss.0.server_seal, hex16(cap::SERVER_SEALING_KEY_NTLM));
    assert_eq!(s.workstation, "DRIVER311");
}

#[test]
fn binding_sign_in_reproduces_the_windows_server() {
    let s = sign_in(
        cap::BIND_SESSION_SETUP_REQ1,
        cap::BIND_SESSION_SETUP_RESP1,
        cap::BIND_SESSION_SETUP_REQ2,
        cap::BIND_SESSION_SETUP_RESP2,
        cap::BIND_SERVER_CHALLENGE,
        "413B42AECBAED001",
    );
    assert_eq!(s.session_key(), hex16(cap::BIND_SESSION_KEY));
    let req = hex(cap::BIND_SESSION_SETUP_REQ1);
    assert!(SessionSetupRequest::decode(&req).unwrap().is_binding());
}

#[test]
fn wrong_password_or_tampered_mic_fails() {
    let req1 = hex(cap::SESSION_SETUP_REQ1);
    let t1 =
        parse_client_token(SessionSetupRequest::decode(&req1).unwrap().security_buffer).unwrap();
    let req2 = hex(cap::SESSION_SETUP_REQ2);
    let sec2 = SessionSetupRequest::decode(&req2)
        .unwrap()
        .security_buffer
        .to_vec();
    let auth = parse_client_token(&sec2).unwrap().ntlm().unwrap().to_vec();

    let mut s = NtlmServer::new(params(cap::SERVER_CHALLENGE, "A1A1F5ADCBAED001"));
    s.negotiate(t1.ntlm().unwrap()).unwrap();
    let mut s2 = s.clone();
    assert!(s
        .authenticate(&auth, |_, _| Some(nt_hash("Password01?")))
        .is_err());

    // Flip a MIC byte (offset 72 of the AUTHENTICATE).
    let mut bad = auth.clone();
    bad[72] ^= 1;
    assert_eq!(
        s2.clone()
            .authenticate(&bad, |_, _| Some(nt_hash(cap::PASSWORD)))
            .unwrap_err(),
        smb_proto::auth::AuthError::BadMic
    );
    assert!(s2.authenticate(&auth, |_, _| None).is_err());
}
