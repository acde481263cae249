//! Whole login exchanges driven in memory against `TargetLogin` with a fake policy.

use bytes::Bytes;
use iscsi_proto::chap::{ChapAlgorithm, ChapCredentials};
use iscsi_proto::login::{LoginOutcome, LoginPolicy, LoginRefusal, LoginStep, TargetLogin};
use iscsi_proto::negotiation::{SessionType, TargetDefaults};
use iscsi_proto::pdu::{LoginRequest, LoginResponse};
use iscsi_proto::text;

const TARGET: &str = "iqn.2026-01.org.lanes:disk1";
const INITIATOR: &str = "iqn.1993-08.org.debian:01:abc";

struct Policy {
    chap: Option<ChapCredentials>,
    admitted: Vec<LoginOutcome>,
    random: u8,
}

impl Policy {
    fn new(chap: Option<ChapCredentials>) -> Self {
        Policy {
            chap,
            admitted: Vec::new(),
            random: 0,
        }
    }
}

impl LoginPolicy for Policy {
    fn portal_group_tag(&self) -> u16 {
        7
    }
    fn authorize(
        &mut self,
        _i: &str,
        target: &str,
    ) -> Result<Option<ChapCredentials>, LoginRefusal> {
        if target != TARGET {
            return Err(LoginRefusal::NotFound);
        }
        Ok(self.chap.clone())
    }
    fn discovery_auth(&mut self, _i: &str) -> Result<Option<ChapCredentials>, LoginRefusal> {
        Ok(None)
    }
    fn admit(&mut self, login: &LoginOutcome) -> Result<u16, LoginRefusal> {
        self.admitted.push(login.clone());
        if login.tsih == 0 {
            Ok(0x1234)
        } else if login.tsih == 0x1234 {
            Ok(login.tsih)
        } else {
            Err(LoginRefusal::SessionDoesNotExist)
        }
    }
    fn fill_random(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.random = self.random.wrapping_mul(31).wrapping_add(17);
            *b = self.random;
        }
    }
}

fn req(csg: u8, nsg: u8, transit: bool, keys: &[(&str, &str)]) -> LoginRequest {
    LoginRequest {
        transit,
        continue_bit: false,
        csg,
        nsg,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0x02, 0x3d, 0, 1],
        tsih: 0,
        itt: 0x10,
        cid: 1,
        cmd_sn: 100,
        exp_stat_sn: 500,
        data: text::encode(keys),
    }
}

fn keys(resp: &LoginResponse) -> Vec<(String, String)> {
    text::parse(&resp.data)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn get(resp: &LoginResponse, key: &str) -> Option<String> {
    keys(resp)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

fn cont(step: LoginStep) -> LoginResponse {
    match step {
        LoginStep::Continue(r) => {
            assert_eq!(r.status_class, 0);
            r
        }
        other => panic!("expected Continue, got {other:?}"),
    }
}

fn failed(step: LoginStep, expect: LoginRefusal) {
    match step {
        LoginStep::Failed(r, refusal) => {
            assert_eq!(refusal, expect);
            assert_eq!((r.status_class, r.status_detail), expect.status());
        }
        other => panic!("expected Failed({expect:?}), got {other:?}"),
    }
}

const SECURITY: &[(&str, &str)] = &[
    ("InitiatorName", INITIATOR),
    ("InitiatorAlias", "host1"),
    ("SessionType", "Normal"),
    ("TargetName", TARGET),
    ("AuthMethod", "None"),
];

const OPERATIONAL: &[(&str, &str)] = &[
    ("HeaderDigest", "CRC32C,None"),
    ("DataDigest", "None"),
    ("MaxConnections", "1"),
    ("InitialR2T", "No"),
    ("ImmediateData", "Yes"),
    ("MaxRecvDataSegmentLength", "262144"),
    ("MaxBurstLength", "16776192"),
    ("FirstBurstLength", "262144"),
    ("DefaultTime2Wait", "2"),
    ("DefaultTime2Retain", "0"),
    ("MaxOutstandingR2T", "1"),
    ("DataPDUInOrder", "Yes"),
    ("DataSequenceInOrder", "Yes"),
    ("ErrorRecoveryLevel", "0"),
];

fn finish_operational(
    login: &mut TargetLogin,
    policy: &mut Policy,
) -> (LoginResponse, LoginOutcome) {
    match login.handle(&req(1, 3, true, OPERATIONAL), policy) {
        LoginStep::Complete(r, outcome) => {
            assert!(r.transit);
            assert_eq!((r.csg, r.nsg), (1, 3));
            assert_eq!(r.tsih, 0x1234);
            (r, *outcome)
        }
        other => panic!("expected Complete, got {other:?}"),
    }
}

#[test]
fn auth_none_normal_session() {
    let mut policy = Policy::new(None);
    let mut login = TargetLogin::new(TargetDefaults::default());
    let r = cont(login.handle(&req(0, 1, true, SECURITY), &mut policy));
    assert!(r.transit);
    assert_eq!((r.csg, r.nsg), (0, 1));
    assert_eq!(r.stat_sn, 500);
    assert_eq!(r.exp_cmd_sn, 100);
    assert_eq!(r.tsih, 0);
    assert_eq!(get(&r, "AuthMethod").as_deref(), Some("None"));
    assert_eq!(get(&r, "TargetPortalGroupTag").as_deref(), Some("7"));
    let (r, outcome) = finish_operational(&mut login, &mut policy);
    assert_eq!(r.stat_sn, 501);
    assert_eq!(get(&r, "HeaderDigest").as_deref(), Some("CRC32C"));
    assert_eq!(
        get(&r, "MaxRecvDataSegmentLength").as_deref(),
        Some("262144")
    );
    assert_eq!(outcome.next_stat_sn, 502);
    assert_eq!(outcome.session.session_type, SessionType::Normal);
    assert_eq!(outcome.session.initiator_name, INITIATOR);
    assert_eq!(outcome.session.initiator_alias.as_deref(), Some("host1"));
    assert_eq!(outcome.session.target_name.as_deref(), Some(TARGET));
    assert_eq!(outcome.session.max_burst_length, 1_048_576);
    assert_eq!(outcome.session.first_burst_length, 262_144);
    assert!(!outcome.session.initial_r2t);
    assert!(outcome.connection.header_digest && !outcome.connection.data_digest);
    assert_eq!(outcome.connection.max_xmit_data_segment_length, 262_144);
    assert_eq!(outcome.authenticated_user, None);
    assert_eq!(policy.admitted.len(), 1);
    assert!(login.is_complete());
}

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
fn operational_first_without_security_stage() {
    let mut policy = Policy::new(None);
    let mut login = TargetLogin::new(TargetDefaults::default());
    let mut first: Vec<_> = SECURITY
        .iter()
        .copied()
        .filter(|(k, _)| *k != "AuthMethod")
        .collect();
    first.extend_from_slice(OPERATIONAL);
    match login.handle(&req(1, 3, true, &first), &mut policy) {
        LoginStep::Complete(r, outcome) => {
            assert_eq!(get(&r, "TargetPortalGroupTag").as_deref(), Some("7"));
            assert_eq!(r.stat_sn, 500);
            assert_eq!(outcome.session.max_outstanding_r2t, 1);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn discovery_session() {
    let mut policy = Policy::new(None);
    let mut login = TargetLogin::new(TargetDefaults::default());
    let r = cont(login.handle(
        &req(
            0,
            1,
            true,
            &[
                ("InitiatorName", INITIATOR),
                ("SessionType", "Discovery"),
                ("AuthMethod", "None"),
            ],
        ),
        &mut policy,
    ));
    assert!(get(&r, "TargetPortalGroupTag").is_none());
    match login.handle(
        &req(
            1,
            3,
            true,
            &[
                ("MaxRecvDataSegmentLength", "32768"),
                ("MaxConnections", "1"),
            ],
        ),
        &mut policy,
    ) {
        LoginStep::Complete(r, outcome) => {
            assert_eq!(get(&r, "MaxConnections").as_deref(), Some("Irrelevant"));
            assert_eq!(outcome.session.session_type, SessionType::Discovery);
            assert_eq!(outcome.connection.max_xmit_data_segment_length, 32768);
            assert_eq!(outcome.session.target_name, None);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_names_bad_version_and_unknown_target() {
    let mut policy = Policy::new(None);
    let no_initiator: Vec<_> = SECURITY
        .iter()
        .copied()
        .filter(|(k, _)| *k != "InitiatorName")
        .collect();
    let step = TargetLogin::new(TargetDefaults::default())
        .handle(&req(0, 1, true, &no_initiator), &mut policy);
    failed(step, LoginRefusal::MissingParameter);
    let no_target: Vec<_> = SECURITY
        .iter()
        .copied()
        .filter(|(k, _)| *k != "TargetName")
        .collect();
    let step = TargetLogin::new(TargetDefaults::default())
        .handle(&req(0, 1, true, &no_target), &mut policy);
    failed(step, LoginRefusal::MissingParameter);
    let mut bad = req(0, 1, true, SECURITY);
    bad.version_min = 1;
    bad.version_max = 2;
    let step = TargetLogin::new(TargetDefaults::default()).handle(&bad, &mut policy);
    failed(step, LoginRefusal::UnsupportedVersion);
    let other: Vec<_> = SECURITY
        .iter()
        .map(|&(k, v)| {
            if k == "TargetName" {
                (k, "iqn.2026-01.org.lanes:nope")
            } else {
                (k, v)
            }
        })
        .collect();
    let step =
        TargetLogin::new(TargetDefaults::default()).handle(&req(0, 1, true, &other), &mut policy);
    failed(step, LoginRefusal::NotFound);
}

#[test]
fn multi_pdu_text_with_c_bit() {
    let mut policy = Policy::new(None);
    let mut login = TargetLogin::new(TargetDefaults::default());
    let all = text::encode(SECURITY);
    let (a, b) = all.split_at(10); // splits inside "InitiatorName=..."
    let mut first = req(0, 1, false, &[]);
    first.continue_bit = true;
    first.data = Bytes::copy_from_slice(a);
    let r = cont(login.handle(&first, &mut policy));
    assert!(r.data.is_empty() && !r.transit);
    let mut second = req(0, 1, true, &[]);
    second.data = Bytes::copy_from_slice(b);
    let r = cont(login.handle(&second, &mut policy));
    assert!(r.transit);
    assert_eq!(r.stat_sn, 501);
    assert_eq!(get(&r, "AuthMethod").as_deref(), Some("None"));
    finish_operational(&mut login, &mut policy);
}

#[test]
fn c_bit_text_is_bounded() {
    let mut policy = Policy::new(None);
    let mut login = TargetLogin::new(TargetDefaults::default());
    let mut piece = req(0, 1, false, &[]);
    piece.continue_bit = true;
    piece.data = Bytes::from(vec![b'a'; 8192]);
    for _ in 0..8 {
        cont(login.handle(&piece, &mut policy));
    }
    failed(
        login.handle(&piece, &mut policy),
        LoginRefusal::OutOfResources,
    );
}

#[test]
fn header_rules() {
    let mut policy = Policy::new(None);
    // ISID changes between requests.
    let mut login = TargetLogin::new(TargetDefaults::default());
    cont(login.handle(&req(0, 1, false, SECURITY), &mut policy));
    let mut next = req(0, 1, true, &[]);
    next.isid[5] = 9;
    failed(
        login.handle(&next, &mut policy),
        LoginRefusal::InitiatorError,
    );
    // NSG=2 is reserved; T and C together; going backwards.
    for (csg, nsg, c) in [
        (0, 2, false),
        (0, 1, true),
        (1, 0, false),
        (1, 1, false),
        (3, 3, false),
    ] {
        let mut r = req(csg, nsg, true, SECURITY);
        r.continue_bit = c;
        let step = TargetLogin::new(TargetDefaults::default()).handle(&r, &mut policy);
        failed(step, LoginRefusal::InitiatorError);
    }
    // An operational key in the security stage, a security key in the operational stage.
    let mut early = SECURITY.to_vec();
    early.push(("MaxBurstLength", "512"));
    let step =
        TargetLogin::new(TargetDefaults::default()).handle(&req(0, 1, true, &early), &mut policy);
    failed(step, LoginRefusal::InitiatorError);
    let mut login = TargetLogin::new(TargetDefaults::default());
    cont(login.handle(&req(0, 1, true, SECURITY), &mut policy));
    failed(
        login.handle(&req(1, 3, true, &[("CHAP_A", "5")]), &mut policy),
        LoginRefusal::InitiatorError,
    );
    // Too many PDUs.
    let mut login = TargetLogin::new(TargetDefaults::default());
    cont(login.handle(&req(0, 1, false, SECURITY), &mut policy));
    let mut last = None;
    for _ in 0..20 {
        last = Some(login.handle(&req(0, 1, false, &[]), &mut policy));
        if matches!(last, Some(LoginStep::Failed(..))) {
            break;
        }
    }
    failed(last.unwrap(), LoginRefusal::InitiatorError);
    // Renegotiating a key.
    let mut login = TargetLogin::new(TargetDefaults::default());
    cont(login.handle(&req(0, 1, true, SECURITY), &mut policy));
    cont(login.handle(
        &req(1, 3, false, &[("MaxBurstLength", "4096")]),
        &mut policy,
    ));
    failed(
        login.handle(&req(1, 3, true, &[("MaxBurstLength", "8192")]), &mut policy),
        LoginRefusal::InitiatorError,
    );
}

#[test]
fn non_leading_connection_joins_session() {
    let mut policy = Policy::new(None);
    let mut login = TargetLogin::new(TargetDefaults::default());
    let mut first = req(0, 1, true, SECURITY);
    first.tsih = 0x1234;
    first.cid = 2;
    cont(login.handle(&first, &mut policy));
    let mut op = req(1, 3, true, OPERATIONAL);
    op.tsih = 0x1234;
    op.cid = 2;
    match login.handle(&op, &mut policy) {
        LoginStep::Complete(r, outcome) => {
            assert_eq!(r.tsih, 0x1234);
            assert_eq!(outcome.cid, 2);
            assert_eq!(get(&r, "MaxBurstLength").as_deref(), Some("Irrelevant"));
            assert_eq!(get(&r, "HeaderDigest").as_deref(), Some("CRC32C"));
        }
        other => panic!("{other:?}"),
    }
    // A TSIH the policy does not know.
    let mut login = TargetLogin::new(TargetDefaults::default());
    let mut first = req(0, 3, true, SECURITY);
    first.tsih = 0x9999;
    failed(
        login.handle(&first, &mut policy),
        LoginRefusal::SessionDoesNotExist,
    );
}
