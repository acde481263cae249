//! Whole login exchanges driven in memory against `TargetLogin` with a fake policy: no
//! authentication, discovery, header and stage rules, C-bit text, MC/S connections.

mod common;

use bytes::Bytes;
use common::*;
use iscsi_proto::login::{LoginRefusal, LoginStep, TargetLogin};
use iscsi_proto::negotiation::{SessionType, TargetDefaults};
use iscsi_proto::text;

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

#[test]
fn exchange_through_the_framer() {
    use bytes::BytesMut;
    use iscsi_proto::{Framer, Pdu};
    let framer = Framer::default();
    let mut policy = Policy::new(None);
    let mut login = TargetLogin::new(TargetDefaults::default());
    let mut outcome = None;
    for request in [req(0, 1, true, SECURITY), req(1, 3, true, OPERATIONAL)] {
        let mut wire = BytesMut::from(&framer.encode_to_vec(&Pdu::LoginRequest(request))[..]);
        let Ok(Some(Pdu::LoginRequest(decoded))) = framer.decode(&mut wire) else {
            panic!("decode")
        };
        let step = login.handle(&decoded, &mut policy);
        let mut back =
            BytesMut::from(&framer.encode_to_vec(&Pdu::LoginResponse(step.response().clone()))[..]);
        let Ok(Some(Pdu::LoginResponse(resp))) = framer.decode(&mut back) else {
            panic!("decode response")
        };
        assert_eq!(&resp, step.response());
        if let LoginStep::Complete(_, o) = step {
            outcome = Some(o);
        }
    }
    // The negotiated framing for the full-feature phase.
    let ffp = outcome.unwrap().connection.framer();
    assert!(ffp.header_digest && !ffp.data_digest);
    assert_eq!(ffp.max_recv_data_segment_length, 262_144);
}
