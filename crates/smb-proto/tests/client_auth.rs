//! The client side of NTLMv2, SPNEGO and SESSION_SETUP: the MS-NLMP 4.2.4 AUTHENTICATE rebuilt
//! byte for byte, and round trips against this crate's own server side (keys, MICs, preauth
//! hash and the signed final response, for a new session and for a binding).

mod common;

use common::{hex, hex16};
use smb_proto::auth::ntlm::{av, AuthenticateMessage, AvPair, ChallengeMessage};
use smb_proto::auth::ntlm_client::{ntlmv2_response, ClientRandom, Credentials, NtlmClient};
use smb_proto::auth::ntlm_server::{nt_hash, ntowf_v2, ChallengeParams, NtlmServer};
use smb_proto::auth::AuthError;
use smb_proto::client::{
    request_header, Binding, ClientAuth, ClientError, SessionSetup, SetupStep,
};
use smb_proto::crypto::{PreauthHash, SessionKeys, SigningAlgorithm, SigningKey};
use smb_proto::msg::{encode_message, SessionSetupRequest, SessionSetupResponse};
use smb_proto::server::{AuthStep, SessionAuth};
use smb_proto::{Command, Header, NtStatus};

const CHALLENGE: &str =
    "4e544c4d53535000020000000c000c003800000033828ae20123456789abcdef0000000000000000
    2400240044000000060070170000000f53006500720076006500720002000c0044006f006d00610069006e0001000c
    0053006500720076006500720000000000";
const AUTHENTICATE: &str =
    "4e544c4d5353500003000000180018006c00000054005400840000000c000c00480000000800
    080054000000100010005c00000010001000d8000000358288e20501280a0000000f44006f006d00610069006e0055
    0073006500720043004f004d005000550054004500520086c35097ac9cec102554764a57cccc19aaaaaaaaaaaaaaaa
    68cd0ab851e51c96aabc927bebef6a1c01010000000000000000000000000000aaaaaaaaaaaaaaaa0000000002000c
    0044006f006d00610069006e0001000c005300650072007600650072000000000000000000c5dad2544fc9799094ce
    1ce90bc9d03e";

fn utf16(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

#[test]
fn challenge_decodes_and_authenticate_matches_ms_nlmp_4_2_4() {
    let c = ChallengeMessage::decode(&hex(CHALLENGE)).unwrap();
    assert_eq!(c.target_name, "Server");
    assert_eq!(c.flags, 0xE28A_8233);
    assert_eq!(c.server_challenge.to_vec(), hex("0123456789abcdef"));
    assert_eq!(c.target_info.len(), 2);
    assert_eq!(c.timestamp(), None);
    assert_eq!(c.encode(), hex(CHALLENGE));

    let key = ntowf_v2(&nt_hash("Password"), "User", "Domain");
    let v2 = ntlmv2_response(&key, &c.server_challenge, &[0xaa; 8], 0, &c.target_info);
    assert_eq!(
        v2.session_base_key,
        hex16("8de40ccadbc14a82f15cb0ad0de95ca3")
    );
    // RC4 of the RandomSessionKey (0x55 x 16) under the key exchange key.
    let enc = hex16("c5dad2544fc9799094ce1ce90bc9d03e");
    let (d, u, w) = (utf16("Domain"), utf16("User"), utf16("COMPUTER"));
    let msg = AuthenticateMessage {
        lm_response: &v2.lm_response,
        nt_response: &v2.nt_response,
        domain: &d,
        user: &u,
        workstation: &w,
        encrypted_random_session_key: &enc,
        flags: 0xE288_8235,
        mic: None,
    }
    .encode([0x05, 0x01, 0x28, 0x0a, 0, 0, 0, 0x0f]);
    assert_eq!(msg, hex(AUTHENTICATE));
}

fn creds(password: &str) -> Credentials {
    Credentials {
        user: "alice".into(),
        domain: "WORKGROUP".into(),
        password: password.into(),
        workstation: "BENCH".into(),
    }
}

fn random(seed: u8) -> ClientRandom {
    ClientRandom {
        client_challenge: [seed; 8],
        session_key: [seed.wrapping_add(1); 16],
        now: 0x01DC_0000_0000_0000,
    }
}

fn params() -> ChallengeParams {
    ChallengeParams {
        server_challenge: [7; 8],
        timestamp: 0x01DC_1234_5678_9ABC,
        nb_domain: "LANES".into(),
        nb_computer: "LANES".into(),
        dns_domain: String::new(),
        dns_computer: "lanes".into(),
        version: [10, 0, 0x61, 0x4a, 0, 0, 0, 15],
    }
}

#[test]
fn ntlm_client_and_server_agree_on_keys_and_the_mic() {
    let mut client = NtlmClient::new(creds("secret"), random(3));
    let mut server = NtlmServer::new(params());
    let challenge = server.negotiate(&client.negotiate().unwrap()).unwrap();
    let (auth, session) = client.authenticate(&challenge).unwrap();
    let parsed = AuthenticateMessage::decode(&auth).unwrap();
    assert!(parsed.mic.is_some(), "a server timestamp asks for a MIC");
    assert_eq!(parsed.lm_response, &[0u8; 24][..]);
    let done = server
        .authenticate(&auth, |u, _| (u == "alice").then(|| nt_hash("secret")))
        .unwrap();
    assert_eq!(done.session_key(), session.session_key());
    assert_eq!(
        session.session_key(),
        [4; 16],
        "the key exchange carries our key"
    );

    // A flipped byte anywhere in the MIC'd messages fails the MIC or the response.
    let mut client = NtlmClient::new(creds("secret"), random(3));
    let mut server = NtlmServer::new(params());
    let challenge = server.negotiate(&client.negotiate().unwrap()).unwrap();
    let (mut auth, _) = client.authenticate(&challenge).unwrap();
    auth[75] ^= 1;
    assert_eq!(
        server
            .authenticate(&auth, |_, _| Some(nt_hash("secret")))
            .unwrap_err(),
        AuthError::BadMic
    );
}

#[test]
fn wrong_password_is_refused_by_the_server() {
    let mut client = NtlmClient::new(creds("wrong"), random(5));
    let mut server = NtlmServer::new(params());
    let challenge = server.negotiate(&client.negotiate().unwrap()).unwrap();
    let (auth, _) = client.authenticate(&challenge).unwrap();
    assert_eq!(
        server
            .authenticate(&auth, |_, _| Some(nt_hash("secret")))
            .unwrap_err(),
        AuthError::BadResponse
    );
}

/// The NTLMv2 response of smbtorture's smb2.session.ntlmssp_bug14932 (Samba bug 14932): a
/// 95-byte response whose client challenge carries AV pairs cut short. It is a malformed token
/// (the server answers INVALID_PARAMETER), refused before the user is looked up.
#[test]
fn truncated_ntlmv2_response_is_malformed() {
    let nt = hex("abababababababababababababababab0101000000000000
         3f3f3f3f3f3f3f3fb8823af1b3dd08150000000011a20881
         503822782b9447fe54947bff17275ab4f418badc2c38fd5b
         fb0ec1851ecc92bb9bb1c4d55314ff8c7649f5459019a2");
    assert_eq!(nt.len(), 95);
    let mut client = NtlmClient::new(creds("secret"), random(3));
    let mut server = NtlmServer::new(params());
    server.negotiate(&client.negotiate().unwrap()).unwrap();
    let (u, d, w) = (utf16("alice"), utf16("WORKGROUP"), utf16("BENCH"));
    let auth = AuthenticateMessage {
        lm_response: &[0; 24],
        nt_response: &nt,
        domain: &d,
        user: &u,
        workstation: &w,
        encrypted_random_session_key: &[0; 16],
        flags: 0xE288_8235,
        mic: None,
    }
    .encode([10, 0, 0x61, 0x4a, 0, 0, 0, 15]);
    let mut looked_up = false;
    let err = server
        .authenticate(&auth, |_, _| {
            looked_up = true;
            Some(nt_hash("secret"))
        })
        .unwrap_err();
    assert!(matches!(err, AuthError::Malformed(_)), "{err:?}");
    assert!(!looked_up);
}

#[test]
fn out_of_order_steps_are_errors() {
    let mut client = NtlmClient::new(creds("x"), random(1));
    assert_eq!(
        client.authenticate(&hex(CHALLENGE)).unwrap_err(),
        AuthError::OutOfOrder
    );
    let mut a = ClientAuth::new(creds("x"), random(1));
    assert_eq!(a.on_result(&[]).unwrap_err(), AuthError::OutOfOrder);
    // A challenge that is not NTLM.
    let mut a = ClientAuth::new(creds("x"), random(1));
    a.first_token().unwrap();
    assert!(a.on_challenge(&[0xA1, 0x03, 0x30, 0x01, 0x00]).is_err());
}

#[test]
fn spnego_client_and_server_complete_with_both_mech_list_mics() {
    let mut client = ClientAuth::new(creds("secret"), random(9));
    let mut server = SessionAuth::new(params());
    let lookup = |_: &str, _: &str| Some(nt_hash("secret"));
    let AuthStep::Continue(t) = server.step(&client.first_token().unwrap(), lookup).unwrap() else {
        panic!("server finished early");
    };
    let t = client.on_challenge(&t).unwrap();
    let AuthStep::Done { session, token } = server.step(&t, lookup).unwrap() else {
        panic!("server did not finish");
    };
    assert!(!token.is_empty());
    let mine = client.on_result(&token).unwrap();
    assert_eq!(mine.session_key(), session.session_key());
}

/// A server stand-in for SESSION_SETUP: our server-side SessionAuth, preauth hash and keys.
struct FakeServer {
    auth: SessionAuth,
    preauth: PreauthHash,
    session_id: u64,
    binding_key: Option<SigningKey>,
}

impl FakeServer {
    fn answer(&mut self, req: &[u8]) -> Vec<u8> {
        let h = Header::decode(req).unwrap();
        let r = smb_proto::msg::Request::decode(&h, req).unwrap();
        let smb_proto::msg::Request::SessionSetup(s) = r else {
            panic!()
        };
        if let Some(k) = &self.binding_key {
            assert!(
                h.flags.is_signed() && k.verify(req),
                "binding requests are signed"
            );
        }
        self.preauth.update(req);
        match self
            .auth
            .step(s.security_buffer, |_, _| Some(nt_hash("secret")))
        {
            Ok(AuthStep::Continue(token)) => {
                let mut rh = Header::response_to(&h, NtStatus::MORE_PROCESSING_REQUIRED, 32);
                rh.session_id = self.session_id;
                let mut m = encode_message(
                    &rh,
                    &SessionSetupResponse {
                        session_flags: 0,
                        security_buffer: &token,
                    },
                );
                if let Some(k) = &self.binding_key {
                    k.sign(&mut m).unwrap();
                }
                self.preauth.update(&m);
                m
            }
            Ok(AuthStep::Done { session, token }) => {
                let mut rh = Header::response_to(&h, NtStatus::SUCCESS, 32);
                rh.session_id = self.session_id;
                let mut m = encode_message(
                    &rh,
                    &SessionSetupResponse {
                        session_flags: 0,
                        security_buffer: &token,
                    },
                );
                let key = if self.binding_key.is_some() {
                    SessionKeys::channel_signing_key(&session.session_key(), &self.preauth)
                } else {
                    SessionKeys::derive_311(&session.session_key(), &self.preauth, None).signing
                };
                SigningKey::new(SigningAlgorithm::AesGmac, key)
                    .sign(&mut m)
                    .unwrap();
                m
            }
            Err(_) => {
                let mut rh = Header::response_to(&h, NtStatus::LOGON_FAILURE, 1);
                rh.session_id = self.session_id;
                encode_message(&rh, &smb_proto::msg::ErrorResponse::default())
            }
        }
    }
}

fn run_setup(password: &str, binding: Option<Binding>, seed: u8) -> Result<SetupStep, ClientError> {
    let conn_preauth = PreauthHash([seed; 64]);
    let mut server = FakeServer {
        auth: SessionAuth::new(params()),
        preauth: conn_preauth,
        session_id: 0x77,
        binding_key: binding.as_ref().map(|b| b.session_signing.clone()),
    };
    let (mut setup, mut token) =
        SessionSetup::start(creds(password), random(seed), conn_preauth, binding).unwrap();
    for mid in 1.. {
        let mut h = request_header(Command::SessionSetup, mid, 1, 32, setup.session_id(), 0);
        h.flags.0 = 0;
        let body = SessionSetupRequest {
            flags: setup.request_flags(),
            security_mode: 1,
            security_buffer: &token,
            ..Default::default()
        };
        let mut req = encode_message(&h, &body);
        if let Some(k) = setup.request_key() {
            k.sign(&mut req).unwrap();
        }
        setup.sent(&req);
        let resp = server.answer(&req);
        match setup.on_response(&resp, SigningAlgorithm::AesGmac, None)? {
            SetupStep::Send(t) => token = t,
            done => return Ok(done),
        }
        assert!(mid < 3, "the exchange takes two round trips");
    }
    unreachable!()
}

#[test]
fn session_setup_and_binding_against_the_server_side() {
    let SetupStep::Done(done) = run_setup("secret", None, 1).unwrap() else {
        panic!()
    };
    assert_eq!(done.session_id, 0x77);
    let binding = Binding {
        session_id: 0x77,
        session_signing: done.channel_signing.clone(),
    };
    let SetupStep::Done(bound) = run_setup("secret", Some(binding.clone()), 2).unwrap() else {
        panic!()
    };
    assert_ne!(
        bound.channel_signing, done.channel_signing,
        "a channel has its own key"
    );
    assert_eq!(
        run_setup("nope", None, 1).unwrap_err(),
        ClientError::Status(NtStatus::LOGON_FAILURE)
    );
    assert_eq!(
        run_setup("nope", Some(binding), 3).unwrap_err(),
        ClientError::Status(NtStatus::LOGON_FAILURE)
    );
}

#[test]
fn av_pair_flags_carry_the_mic_bit() {
    let mut client = NtlmClient::new(creds("secret"), random(3));
    let mut server = NtlmServer::new(params());
    let challenge = server.negotiate(&client.negotiate().unwrap()).unwrap();
    let (auth, _) = client.authenticate(&challenge).unwrap();
    let parsed = AuthenticateMessage::decode(&auth).unwrap();
    let resp = smb_proto::auth::ntlm::NtlmV2Response::decode(parsed.nt_response).unwrap();
    assert_eq!(resp.av_flags() & av::FLAG_MIC_PRESENT, av::FLAG_MIC_PRESENT);
    assert!(resp
        .av_pairs
        .contains(&AvPair::timestamp(0x01DC_1234_5678_9ABC)));
}

#[test]
fn a_write_head_and_its_data_decode_as_one_write() {
    use smb_proto::msg::{FileId, Message as _, WriteRequest};
    let w = WriteRequest {
        offset: 1 << 20,
        file_id: FileId {
            persistent: 1,
            volatile: 2,
        },
        flags: 0,
        ..Default::default()
    };
    let mut msg = request_header(Command::Write, 5, 1, 1, 9, 3)
        .to_bytes()
        .to_vec();
    w.encode_head(4, &mut msg);
    msg.extend_from_slice(b"data");
    let back = WriteRequest::decode(&msg).unwrap();
    assert_eq!(back.data, b"data");
    assert_eq!(back.offset, 1 << 20);
    assert_eq!(back.file_id, w.file_id);
}
