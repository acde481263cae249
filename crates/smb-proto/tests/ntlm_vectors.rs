//! NTLMv2 against MS-NLMP 4.2.4 ("NTLMv2 Authentication" examples; common values of 4.2.1:
//! user "User", domain "Domain", password "Password", server challenge 0123456789abcdef,
//! client challenge aaaaaaaaaaaaaaaa, time 0, RandomSessionKey 55 x 16).

mod common;

use common::{hex, hex16};
use smb_proto::auth::ntlm::{av, AuthenticateMessage, AvPair, ChallengeMessage, NtlmV2Response};
use smb_proto::auth::ntlm_server::{nt_hash, ntowf_v2, verify_ntlmv2, GssKeys};
use smb_proto::auth::AuthError;

/// MS-NLMP 4.2.4.3: the CHALLENGE_MESSAGE.
const CHALLENGE: &str =
    "4e544c4d53535000020000000c000c003800000033828ae20123456789abcdef0000000000000000
    2400240044000000060070170000000f53006500720076006500720002000c0044006f006d00610069006e0001000c
    0053006500720076006500720000000000";
/// MS-NLMP 4.2.4.3: the AUTHENTICATE_MESSAGE.
const AUTHENTICATE: &str =
    "4e544c4d5353500003000000180018006c00000054005400840000000c000c00480000000800
    080054000000100010005c00000010001000d8000000358288e20501280a0000000f44006f006d00610069006e0055
    0073006500720043004f004d005000550054004500520086c35097ac9cec102554764a57cccc19aaaaaaaaaaaaaaaa
    68cd0ab851e51c96aabc927bebef6a1c01010000000000000000000000000000aaaaaaaaaaaaaaaa0000000002000c
    0044006f006d00610069006e0001000c005300650072007600650072000000000000000000c5dad2544fc9799094ce
    1ce90bc9d03e";

#[test]
fn one_way_functions() {
    // MS-NLMP 4.2.2.1.2 (NTOWFv1) and 4.2.4.1.1 (NTOWFv2).
    let h = nt_hash("Password");
    assert_eq!(h, hex16("a4f49c406510bdcab6824ee7c30fd852"));
    assert_eq!(
        ntowf_v2(&h, "User", "Domain"),
        hex16("0c868a403bfd7a93a3001ef22ef02e3f")
    );
    assert_eq!(
        ntowf_v2(&h, "user", "Domain"),
        hex16("0c868a403bfd7a93a3001ef22ef02e3f")
    );
    assert_ne!(
        ntowf_v2(&h, "User", "domain"),
        hex16("0c868a403bfd7a93a3001ef22ef02e3f")
    );
}

#[test]
fn challenge_encodes_to_the_spec_bytes() {
    let c = ChallengeMessage {
        target_name: "Server".into(),
        flags: 0xE28A_8233,
        server_challenge: hex("0123456789abcdef").try_into().unwrap(),
        target_info: vec![
            AvPair::name(av::NB_DOMAIN_NAME, "Domain"),
            AvPair::name(av::NB_COMPUTER_NAME, "Server"),
        ],
        version: [6, 0, 0x70, 0x17, 0, 0, 0, 0x0f],
    };
    assert_eq!(c.encode(), hex(CHALLENGE));
}

#[test]
fn spec_authenticate_verifies_and_yields_the_session_keys() {
    let bytes = hex(AUTHENTICATE);
    let auth = AuthenticateMessage::decode(&bytes).unwrap();
    assert_eq!(auth.user_name().unwrap(), "User");
    assert_eq!(auth.domain_name().unwrap(), "Domain");
    assert_eq!(auth.workstation_name().unwrap(), "COMPUTER");
    assert_eq!(auth.mic, None);
    let resp = NtlmV2Response::decode(auth.nt_response).unwrap();
    assert_eq!(
        resp.nt_proof_str,
        &hex("68cd0ab851e51c96aabc927bebef6a1c")[..]
    );
    assert_eq!(resp.client_challenge, [0xaa; 8]);

    let challenge: [u8; 8] = hex("0123456789abcdef").try_into().unwrap();
    let keys = verify_ntlmv2(&auth, &nt_hash("Password"), &challenge).unwrap();
    // MS-NLMP 4.2.4.1.2 (session base key) and 4.2.1 (RandomSessionKey, which the client
    // RC4-encrypted under the key exchange key into c5dad254...).
    assert_eq!(
        keys.session_base_key,
        hex16("8de40ccadbc14a82f15cb0ad0de95ca3")
    );
    assert_eq!(keys.exported_session_key, [0x55; 16]);

    // MS-NLMP 4.2.4.4: the client's signing and sealing keys for that exported key.
    let g = GssKeys::derive(&keys.exported_session_key);
    assert_eq!(g.client_sign, hex16("4788dc861b4782f35d43fd98fe1a2d39"));
    assert_eq!(g.client_seal, hex16("59f600973cc4960a25480a7c196e4c58"));

    assert_eq!(
        verify_ntlmv2(&auth, &nt_hash("password"), &challenge),
        Err(AuthError::BadResponse)
    );
    let mut other = challenge;
    other[0] ^= 1;
    assert_eq!(
        verify_ntlmv2(&auth, &nt_hash("Password"), &other),
        Err(AuthError::BadResponse)
    );
}

/// Some clients fold an empty domain into NTOWFv2 while sending one in the message. The response
/// below is computed here from the MS-NLMP 3.3.2 formulas with an empty UserDom.
#[test]
fn a_response_keyed_without_the_domain_verifies() {
    use hmac::{Hmac, Mac};
    type H = Hmac<md5::Md5>;
    let hm = |k: &[u8], parts: &[&[u8]]| {
        let mut m = <H as Mac>::new_from_slice(k).unwrap();
        parts.iter().for_each(|p| m.update(p));
        m.finalize().into_bytes().to_vec()
    };
    let bytes = hex(AUTHENTICATE);
    let auth = AuthenticateMessage::decode(&bytes).unwrap();
    let blob = &auth.nt_response[16..];
    let challenge = hex("0123456789abcdef");
    let who: Vec<u8> = "USER".encode_utf16().flat_map(u16::to_le_bytes).collect();
    let key = hm(&nt_hash("Password"), &[&who]);
    let proof = hm(&key, &[&challenge, blob]);

    let mut msg = bytes.clone();
    let nt_off = u32::from_le_bytes(msg[24..28].try_into().unwrap()) as usize;
    msg[nt_off..nt_off + 16].copy_from_slice(&proof);
    let auth = AuthenticateMessage::decode(&msg).unwrap();
    assert_eq!(auth.domain_name().unwrap(), "Domain");
    let keys = verify_ntlmv2(&auth, &nt_hash("Password"), &challenge.try_into().unwrap()).unwrap();
    assert_eq!(keys.session_base_key.to_vec(), hm(&key, &[&proof]));
}
