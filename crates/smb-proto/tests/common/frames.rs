//! Captured sessions: loading `tests/data/*.frames`, decoding responses by command and status,
//! and replaying a sign-in to its keys, checking every authentication value the peers sent.

use smb_proto::auth::ntlm::{flags, AuthenticateMessage};
use smb_proto::auth::ntlm_server::{compute_mic, gss_mic, nt_hash, verify_ntlmv2, GssKeys};
use smb_proto::auth::spnego::{parse_client_token, ClientToken};
use smb_proto::crypto::{Cipher, PreauthHash, SessionKeys, SigningAlgorithm};
use smb_proto::msg::negotiate::NegotiateContext;
use smb_proto::msg::*;
use smb_proto::{split_compound, Command, DecodeError, Header, NtStatus};

pub const PASSWORD: &str = "Passw0rd!";

pub struct Capture {
    pub client: Vec<Vec<u8>>,
    pub server: Vec<Vec<u8>>,
}

pub fn load(bytes: &[u8]) -> Capture {
    let mut c = Capture {
        client: Vec::new(),
        server: Vec::new(),
    };
    let mut i = 0;
    while i < bytes.len() {
        let n = u32::from_be_bytes(bytes[i + 1..i + 5].try_into().unwrap()) as usize;
        let frame = bytes[i + 5..i + 5 + n].to_vec();
        match bytes[i] {
            b'C' => c.client.push(frame),
            b'S' => c.server.push(frame),
            t => panic!("tag {t}"),
        }
        i += 5 + n;
    }
    c
}

pub fn signed() -> Capture {
    load(include_bytes!("../data/samba-signed.frames"))
}
pub fn encrypted() -> Capture {
    load(include_bytes!("../data/samba-encrypted.frames"))
}

/// Decodes a response body by its command and status (MS-SMB2 3.3.4.4: errors, STATUS_PENDING
/// and warnings such as STATUS_NO_MORE_FILES carry an ERROR body; MORE_PROCESSING_REQUIRED on
/// SESSION_SETUP and BUFFER_OVERFLOW do not).
pub fn decode_response(h: &Header, m: &[u8]) -> Result<(), DecodeError> {
    let st = h.nt_status();
    let normal = st == NtStatus::SUCCESS
        || st == NtStatus::BUFFER_OVERFLOW
        || (h.command == Command::SessionSetup && st == NtStatus::MORE_PROCESSING_REQUIRED);
    if !normal {
        ErrorResponse::decode(m)?;
        return Ok(());
    }
    match h.command {
        Command::Negotiate => NegotiateResponse::decode(m).map(drop),
        Command::SessionSetup => SessionSetupResponse::decode(m).map(drop),
        Command::Logoff => LogoffResponse::decode(m).map(drop),
        Command::TreeConnect => TreeConnectResponse::decode(m).map(drop),
        Command::TreeDisconnect => TreeDisconnectResponse::decode(m).map(drop),
        Command::Create => CreateResponse::decode(m).map(drop),
        Command::Close => CloseResponse::decode(m).map(drop),
        Command::Flush => FlushResponse::decode(m).map(drop),
        Command::Read => ReadResponse::decode(m).map(drop),
        Command::Write => WriteResponse::decode(m).map(drop),
        Command::Lock => LockResponse::decode(m).map(drop),
        Command::Ioctl => IoctlResponse::decode(m).map(drop),
        Command::Echo => EchoResponse::decode(m).map(drop),
        Command::QueryDirectory => QueryDirectoryResponse::decode(m).map(drop),
        Command::ChangeNotify => ChangeNotifyResponse::decode(m).map(drop),
        Command::QueryInfo => QueryInfoResponse::decode(m).map(drop),
        Command::SetInfo => SetInfoResponse::decode(m).map(drop),
        Command::OplockBreak => OplockBreak::decode(m).map(drop),
        Command::Cancel | Command::Other(_) => Err(DecodeError::Invalid("no such response")),
    }
}

pub fn check_all_decode(client: &[Vec<u8>], server: &[Vec<u8>]) -> (usize, usize) {
    let mut requests = 0;
    for f in client {
        for e in split_compound(f).unwrap() {
            Request::decode(&e.header, e.bytes)
                .unwrap_or_else(|err| panic!("{:?}: {err}", e.header.command));
            requests += 1;
        }
    }
    let mut responses = 0;
    for f in server {
        for e in split_compound(f).unwrap() {
            decode_response(&e.header, e.bytes).unwrap_or_else(|err| {
                panic!("{:?} {:#x}: {err}", e.header.command, e.header.status)
            });
            responses += 1;
        }
    }
    (requests, responses)
}

pub struct Session {
    pub keys: SessionKeys,
    pub signing: SigningAlgorithm,
    pub cipher: Option<Cipher>,
    pub session_id: u64,
}

/// Runs the sign-in: NTLMv2 check, MIC, both mechListMICs, preauth hash, keys.
pub fn sign_in(c: &Capture) -> Session {
    let (neg_req, neg_resp) = (&c.client[0], &c.server[0]);
    let (ss1, ss1_resp, ss2, ss2_resp) = (&c.client[1], &c.server[1], &c.client[2], &c.server[2]);

    let resp = NegotiateResponse::decode(neg_resp).unwrap();
    let mut signing = SigningAlgorithm::AesCmac;
    let mut cipher = None;
    for ctx in &resp.contexts {
        match ctx {
            NegotiateContext::Signing { algorithms } => {
                signing = SigningAlgorithm::from_u16(algorithms[0]).unwrap()
            }
            NegotiateContext::Encryption { ciphers } => cipher = Cipher::from_u16(ciphers[0]),
            _ => {}
        }
    }

    let t1 = parse_client_token(SessionSetupRequest::decode(ss1).unwrap().security_buffer).unwrap();
    let ClientToken::Init {
        mech_types_der,
        mech_token,
        ..
    } = &t1
    else {
        panic!("init")
    };
    let negotiate = mech_token.unwrap();
    let tr = parse_client_token(
        SessionSetupResponse::decode(ss1_resp)
            .unwrap()
            .security_buffer,
    )
    .unwrap();
    let challenge = tr.ntlm().unwrap();
    let server_challenge: [u8; 8] = challenge[24..32].try_into().unwrap();
    let t2 = parse_client_token(SessionSetupRequest::decode(ss2).unwrap().security_buffer).unwrap();
    let auth_bytes = t2.ntlm().unwrap();
    let auth = AuthenticateMessage::decode(auth_bytes).unwrap();
    assert_eq!(auth.user_name().unwrap(), "lanesuser");

    let ntlm = verify_ntlmv2(&auth, &nt_hash(PASSWORD), &server_challenge).unwrap();
    assert!(verify_ntlmv2(&auth, &nt_hash("Passw0rd?"), &server_challenge).is_err());
    assert_eq!(
        Some(compute_mic(
            &ntlm.exported_session_key,
            negotiate,
            challenge,
            auth_bytes
        )),
        auth.mic,
        "smbclient's MIC"
    );
    let g = GssKeys::derive(&ntlm.exported_session_key);
    let kx = auth.flags & flags::KEY_EXCH != 0;
    let client_mic = gss_mic(&g.client_sign, &g.client_seal, 0, mech_types_der, kx);
    assert_eq!(
        Some(&client_mic[..]),
        t2.mech_list_mic(),
        "smbclient's mechListMIC"
    );
    let t3 = parse_client_token(
        SessionSetupResponse::decode(ss2_resp)
            .unwrap()
            .security_buffer,
    )
    .unwrap();
    let server_mic = gss_mic(&g.server_sign, &g.server_seal, 0, mech_types_der, kx);
    assert_eq!(
        Some(&server_mic[..]),
        t3.mech_list_mic(),
        "smbd's mechListMIC"
    );

    let mut h = PreauthHash::default();
    for m in [neg_req, neg_resp, ss1, ss1_resp, ss2] {
        h.update(m);
    }
    let keys = SessionKeys::derive_311(&ntlm.exported_session_key, &h, cipher);
    let session_id = Header::decode(ss2_resp).unwrap().session_id;
    Session {
        keys,
        signing,
        cipher,
        session_id,
    }
}

pub fn features() -> Capture {
    load(include_bytes!("../data/smbprotocol-features.frames"))
}
