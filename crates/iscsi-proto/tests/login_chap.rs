//! Login exchanges with CHAP: one-way for each algorithm, mutual, wrong secret, refusals.

mod common;

use common::*;
use iscsi_proto::chap::{ChapAlgorithm, ChapCredentials};
use iscsi_proto::login::{LoginRefusal, LoginStep, TargetLogin};
use iscsi_proto::negotiation::TargetDefaults;
use iscsi_proto::text;

fn chap_creds(mutual: bool, algorithms: Vec<u8>) -> ChapCredentials {
    ChapCredentials {
        user: "alice".into(),
        secret: b"initiator-secret-12".to_vec(),
        mutual: mutual.then(|| ("lanes".into(), b"target-secret-1234".to_vec())),
        algorithms,
    }
}

/// Runs the CHAP security stage; returns the last response.
fn chap_login(alg: u8, mutual: Option<&str>, secret: &[u8]) -> (TargetLogin, Policy, LoginStep) {
    let mut policy = Policy::new(Some(chap_creds(mutual.is_some(), vec![alg])));
    let mut login = TargetLogin::new(TargetDefaults::default());
    let mut first = SECURITY.to_vec();
    first.retain(|(k, _)| *k != "AuthMethod");
    first.push(("AuthMethod", "CHAP,None"));
    let r = cont(login.handle(&req(0, 1, true, &first), &mut policy));
    assert!(!r.transit);
    assert_eq!(get(&r, "AuthMethod").as_deref(), Some("CHAP"));
    let r = cont(login.handle(&req(0, 1, false, &[("CHAP_A", "8,7,6,5")]), &mut policy));
    assert_eq!(get(&r, "CHAP_A"), Some(alg.to_string()));
    let id: u8 = get(&r, "CHAP_I").unwrap().parse().unwrap();
    let challenge = text::decode_binary(&get(&r, "CHAP_C").unwrap()).unwrap();
    let algorithm = ChapAlgorithm::from_code(alg).unwrap();
    assert_eq!(challenge.len(), algorithm.challenge_len());
    let response = text::encode_hex(&algorithm.response(id, secret, &challenge));
    let mut answer = vec![("CHAP_N", "alice"), ("CHAP_R", response.as_str())];
    if let Some(c) = mutual {
        answer.push(("CHAP_I", "42"));
        answer.push(("CHAP_C", c));
    }
    let step = login.handle(&req(0, 1, true, &answer), &mut policy);
    (login, policy, step)
}

#[test]
fn one_way_chap_each_algorithm() {
    for alg in [5u8, 6, 7, 8] {
        let (mut login, mut policy, step) = chap_login(alg, None, b"initiator-secret-12");
        let r = cont(step);
        assert!(r.transit, "algorithm {alg}");
        assert_eq!((r.csg, r.nsg), (0, 1));
        assert!(get(&r, "CHAP_R").is_none());
        let (_, outcome) = finish_operational(&mut login, &mut policy);
        assert_eq!(outcome.authenticated_user.as_deref(), Some("alice"));
    }
}

#[test]
fn mutual_chap() {
    let (_, _, step) = chap_login(
        7,
        Some("0x00112233445566778899aabbccddeeff"),
        b"initiator-secret-12",
    );
    let r = cont(step);
    assert!(r.transit);
    assert_eq!(get(&r, "CHAP_N").as_deref(), Some("lanes"));
    let expected = ChapAlgorithm::Sha256.response(
        42,
        b"target-secret-1234",
        &text::decode_binary("0x00112233445566778899aabbccddeeff").unwrap(),
    );
    assert_eq!(get(&r, "CHAP_R"), Some(text::encode_hex(&expected)));
}

#[test]
fn wrong_secret_fails() {
    let (login, _, step) = chap_login(5, None, b"wrong-secret");
    failed(step, LoginRefusal::AuthenticationFailed);
    assert_eq!(login.refusal(), Some(LoginRefusal::AuthenticationFailed));
    assert!(login.failure_reason().unwrap().contains("CHAP_R"));
}

#[test]
fn chap_required_but_initiator_offers_none_or_skips_security() {
    let mut policy = Policy::new(Some(chap_creds(false, vec![])));
    let mut login = TargetLogin::new(TargetDefaults::default());
    failed(
        login.handle(&req(0, 1, true, SECURITY), &mut policy),
        LoginRefusal::AuthenticationFailed,
    );
    let mut policy = Policy::new(Some(chap_creds(false, vec![])));
    let mut login = TargetLogin::new(TargetDefaults::default());
    let first: Vec<_> = SECURITY
        .iter()
        .copied()
        .filter(|(k, _)| *k != "AuthMethod")
        .collect();
    failed(
        login.handle(&req(1, 3, true, &first), &mut policy),
        LoginRefusal::AuthenticationFailed,
    );
}

#[test]
fn mutual_chap_refuses_reflected_challenge_and_unconfigured_mutual() {
    // Mutual configured: the initiator sends back the very challenge we sent it.
    let mut policy = Policy::new(Some(chap_creds(true, vec![5])));
    let mut login = TargetLogin::new(TargetDefaults::default());
    let mut first = SECURITY.to_vec();
    first.retain(|(k, _)| *k != "AuthMethod");
    first.push(("AuthMethod", "CHAP"));
    cont(login.handle(&req(0, 1, true, &first), &mut policy));
    let r = cont(login.handle(&req(0, 1, false, &[("CHAP_A", "5")]), &mut policy));
    let id: u8 = get(&r, "CHAP_I").unwrap().parse().unwrap();
    let our_challenge = get(&r, "CHAP_C").unwrap();
    let c = text::decode_binary(&our_challenge).unwrap();
    let resp = text::encode_hex(&ChapAlgorithm::Md5.response(id, b"initiator-secret-12", &c));
    let answer = [
        ("CHAP_N", "alice"),
        ("CHAP_R", resp.as_str()),
        ("CHAP_I", "1"),
        ("CHAP_C", our_challenge.as_str()),
    ];
    failed(
        login.handle(&req(0, 1, true, &answer), &mut policy),
        LoginRefusal::AuthenticationFailed,
    );
    assert!(login.failure_reason().unwrap().contains("reflected"));
    // A later request on a failed login is refused too.
    failed(
        login.handle(&req(0, 1, true, &[]), &mut policy),
        LoginRefusal::InitiatorError,
    );

    // Mutual asked for, none configured.
    let (_, _, step) = {
        let mut policy = Policy::new(Some(chap_creds(false, vec![5])));
        let mut login = TargetLogin::new(TargetDefaults::default());
        cont(login.handle(&req(0, 1, true, &first), &mut policy));
        let r = cont(login.handle(&req(0, 1, false, &[("CHAP_A", "5")]), &mut policy));
        let id: u8 = get(&r, "CHAP_I").unwrap().parse().unwrap();
        let c = text::decode_binary(&get(&r, "CHAP_C").unwrap()).unwrap();
        let resp = text::encode_hex(&ChapAlgorithm::Md5.response(id, b"initiator-secret-12", &c));
        let answer = [
            ("CHAP_N", "alice"),
            ("CHAP_R", resp.as_str()),
            ("CHAP_I", "1"),
            ("CHAP_C", "0x0102030405060708"),
        ];
        let step = login.handle(&req(0, 1, true, &answer), &mut policy);
        (login, policy, step)
    };
    failed(step, LoginRefusal::AuthenticationFailed);
}

#[test]
fn no_common_chap_algorithm() {
    let mut policy = Policy::new(Some(chap_creds(false, vec![7])));
    let mut login = TargetLogin::new(TargetDefaults::default());
    let mut first = SECURITY.to_vec();
    first.retain(|(k, _)| *k != "AuthMethod");
    first.push(("AuthMethod", "CHAP"));
    cont(login.handle(&req(0, 1, true, &first), &mut policy));
    failed(
        login.handle(&req(0, 1, false, &[("CHAP_A", "5")]), &mut policy),
        LoginRefusal::AuthenticationFailed,
    );
}

#[test]
fn chap_keys_before_auth_method_are_an_initiator_error() {
    let mut policy = Policy::new(Some(chap_creds(false, vec![])));
    let mut first = SECURITY.to_vec();
    first.retain(|(k, _)| *k != "AuthMethod");
    first.push(("CHAP_A", "5"));
    let step =
        TargetLogin::new(TargetDefaults::default()).handle(&req(0, 1, false, &first), &mut policy);
    failed(step, LoginRefusal::InitiatorError);
}
