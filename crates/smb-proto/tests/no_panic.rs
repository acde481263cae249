//! Every decoder on random bytes, and on published messages with random bytes changed: an error
//! is fine, a panic is not.

mod common;

use proptest::prelude::*;
use smb_proto::auth::der::read_tlv;
use smb_proto::auth::ntlm::{
    parse_av_pairs, AuthenticateMessage, NegotiateMessage, NtlmV2Response,
};
use smb_proto::auth::ntlm_server::{ChallengeParams, NtlmServer};
use smb_proto::auth::spnego::parse_client_token;
use smb_proto::crypto::transform::{decrypt, TransformHeader};
use smb_proto::crypto::{Cipher, SigningAlgorithm, SigningKey};
use smb_proto::msg::create::parse_create_contexts;
use smb_proto::msg::ioctl::ValidateNegotiateInfo;
use smb_proto::msg::*;
use smb_proto::{split_compound, Command, DirectTcp, Header};

fn all_decoders(b: &[u8]) {
    let _ = Header::decode(b);
    let _ = smb_proto::smb1::negotiate_dialects(b);
    let _ = split_compound(b);
    let _ = DirectTcp { max_frame: 1 << 16 }.decode(b);
    if let Ok(h) = Header::decode(b) {
        let _ = Request::decode(&h, b);
    }
    for c in 0..20u16 {
        let h = Header {
            credit_charge: 0,
            status: 0,
            command: Command::from_u16(c),
            credits: 0,
            flags: Default::default(),
            next_command: 0,
            message_id: 0,
            ids: smb_proto::HeaderIds::Sync {
                process_id: 0,
                tree_id: 0,
            },
            session_id: 0,
            signature: [0; 16],
        };
        let mut m = h.to_bytes().to_vec();
        m.extend_from_slice(b);
        let _ = Request::decode(&h, &m);
        let _ = NegotiateResponse::decode(&m);
        let _ = SessionSetupResponse::decode(&m);
        let _ = TreeConnectResponse::decode(&m);
        let _ = CreateResponse::decode(&m);
        let _ = CloseResponse::decode(&m);
        let _ = ReadResponse::decode(&m);
        let _ = WriteResponse::decode(&m);
        let _ = IoctlResponse::decode(&m);
        let _ = QueryInfoResponse::decode(&m);
        let _ = QueryDirectoryResponse::decode(&m);
        let _ = ChangeNotifyResponse::decode(&m);
        let _ = ErrorResponse::decode(&m);
        let _ = LockResponse::decode(&m);
        let _ = FlushResponse::decode(&m);
        let _ = SetInfoResponse::decode(&m);
        let _ = LogoffResponse::decode(&m);
        let _ = EchoResponse::decode(&m);
        let _ = TreeDisconnectResponse::decode(&m);
    }
    let _ = parse_create_contexts(b);
    let _ = smb_proto::msg::create_ctx::Lease::decode(b);
    let _ = smb_proto::msg::create_ctx::DurableRequestV2::decode(b);
    let _ = smb_proto::msg::create_ctx::DurableReconnectV2::decode(b);
    let _ = smb_proto::msg::create_ctx::decode_maximal_access_request(b);
    let _ = smb_proto::msg::create_ctx::decode_durable_reconnect_v1(b);
    let _ = smb_proto::msg::create_ctx::decode_durable_request_v1(b);
    let _ = smb_proto::msg::create_ctx::DurableResponseV2::decode(b);
    let _ = smb_proto::msg::create_ctx::decode_app_instance_id(b);
    let _ = smb_proto::msg::ioctl::decode_network_interfaces(b);
    let mut auth = smb_proto::server::SessionAuth::new(ChallengeParams {
        server_challenge: [2; 8],
        timestamp: 0,
        nb_domain: "D".into(),
        nb_computer: "C".into(),
        dns_domain: "d".into(),
        dns_computer: "c".into(),
        version: [0; 8],
    });
    let _ = auth.step(b, |_, _| None);
    let _ = auth.step(b, |_, _| Some([0; 16]));
    let _ = ValidateNegotiateInfo::decode(b);
    let _ = TransformHeader::decode(b);
    for c in [
        Cipher::Aes128Ccm,
        Cipher::Aes128Gcm,
        Cipher::Aes256Ccm,
        Cipher::Aes256Gcm,
    ] {
        let mut f = b.to_vec();
        let _ = decrypt(c, &vec![7; c.key_len()], &mut f);
    }
    for a in [SigningAlgorithm::AesCmac, SigningAlgorithm::AesGmac] {
        let _ = SigningKey::new(a, [1; 16]).verify(b);
    }
    let _ = read_tlv(b);
    let _ = parse_client_token(b);
    let _ = NegotiateMessage::decode(b);
    let _ = AuthenticateMessage::decode(b);
    let _ = NtlmV2Response::decode(b);
    let _ = parse_av_pairs(b);
    let mut s = NtlmServer::new(ChallengeParams {
        server_challenge: [1; 8],
        timestamp: 0,
        nb_domain: "D".into(),
        nb_computer: "C".into(),
        dns_domain: "d".into(),
        dns_computer: "c".into(),
        version: [0; 8],
    });
    let _ = s.negotiate(b);
    let _ = s.authenticate(b, |_, _| Some([0; 16]));
}

fn captures() -> Vec<Vec<u8>> {
    use common::captures as c;
    [
        c::NEGOTIATE_REQ,
        c::NEGOTIATE_RESP,
        c::SESSION_SETUP_REQ1,
        c::SESSION_SETUP_RESP1,
        c::SESSION_SETUP_REQ2,
        c::SESSION_SETUP_RESP2,
    ]
    .iter()
    .map(|s| common::hex(s))
    .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5000))]

    #[test]
    fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..400)) {
        all_decoders(&b);
    }

    #[test]
    fn changed_captures_never_panic(
        which in 0usize..6,
        edits in proptest::collection::vec((any::<u16>(), any::<u8>()), 1..6),
        cut in any::<u16>(),
    ) {
        let mut m = captures().swap_remove(which);
        for (at, v) in edits {
            let i = usize::from(at) % m.len();
            m[i] = v;
        }
        all_decoders(&m);
        // The security buffer alone, too, since that is where SPNEGO and NTLM live.
        let tail = m.len().saturating_sub(usize::from(cut) % m.len());
        all_decoders(&m[tail..]);
        all_decoders(&m[64.min(m.len())..]);
    }
}
