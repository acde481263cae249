//! Fuzz target: NEGOTIATE and SESSION_SETUP bodies, the SPNEGO tokens inside, and the NTLM
//! messages inside those, driven through the server-side NTLM exchange.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smb_proto::auth::ntlm::{AuthenticateMessage, NegotiateMessage, NtlmV2Response};
use smb_proto::auth::ntlm_server::{nt_hash, ChallengeParams, NtlmServer};
use smb_proto::auth::spnego::parse_client_token;
use smb_proto::msg::{Message, NegotiateRequest, NegotiateResponse, SessionSetupRequest};

fuzz_target!(|data: &[u8]| {
    // As a whole message (header first) and as a bare body behind a blank header.
    let mut with_header = vec![0xFE, b'S', b'M', b'B', 64, 0];
    with_header.resize(64, 0);
    with_header.extend_from_slice(data);
    for msg in [data, &with_header[..]] {
        if let Ok(n) = NegotiateRequest::decode(msg) {
            let mut out = msg.get(..64).unwrap_or(&[]).to_vec();
            n.encode(&mut out);
            assert_eq!(NegotiateRequest::decode(&out).as_ref(), Ok(&n));
        }
        let _ = NegotiateResponse::decode(msg);
        if let Ok(s) = SessionSetupRequest::decode(msg) {
            token(s.security_buffer);
        }
    }
    token(data);
});

fn token(t: &[u8]) {
    let Ok(tok) = parse_client_token(t) else {
        return;
    };
    let Some(ntlm) = tok.ntlm() else {
        return;
    };
    let _ = NegotiateMessage::decode(ntlm);
    if let Ok(a) = AuthenticateMessage::decode(ntlm) {
        let _ = NtlmV2Response::decode(a.nt_response);
        let _ = a.user_name();
    }
    let mut server = NtlmServer::new(ChallengeParams {
        server_challenge: [0x11; 8],
        timestamp: 0,
        nb_domain: "DOM".into(),
        nb_computer: "SRV".into(),
        dns_domain: "dom".into(),
        dns_computer: "srv".into(),
        version: [10, 0, 0, 0, 0, 0, 0, 15],
    });
    if server.negotiate(ntlm).is_ok() {
        let _ = server.authenticate(ntlm, |_, _| Some(nt_hash("x")));
    }
}
