//! The initiator login machine against iscsi-proto's target login machine, in memory.

use super::*;
use iscsi_proto::chap::ChapCredentials;
use iscsi_proto::login::{LoginOutcome, LoginPolicy, LoginRefusal, LoginStep, TargetLogin};
use iscsi_proto::negotiation::TargetDefaults;

const TARGET: &str = "iqn.2026-01.test.lanes:target";

struct Policy {
    chap: Option<ChapCredentials>,
    random: u8,
}

impl LoginPolicy for Policy {
    fn portal_group_tag(&self) -> u16 {
        3
    }
    fn authorize(
        &mut self,
        _: &str,
        target: &str,
    ) -> Result<Option<ChapCredentials>, LoginRefusal> {
        if target == TARGET {
            Ok(self.chap.clone())
        } else {
            Err(LoginRefusal::NotFound)
        }
    }
    fn discovery_auth(&mut self, _: &str) -> Result<Option<ChapCredentials>, LoginRefusal> {
        Ok(None)
    }
    fn admit(&mut self, _: &LoginOutcome) -> Result<u16, LoginRefusal> {
        Ok(0x77)
    }
    fn fill_random(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.random = self.random.wrapping_mul(31).wrapping_add(17);
            *b = self.random;
        }
    }
}

fn params(target: Option<&str>, chap: Option<(&str, &[u8])>) -> LoginParams {
    LoginParams {
        tsih: 0,
        initiator_name: "iqn.2026-01.test.lanes:initiator".into(),
        target: target.map(str::to_string),
        isid: [0x80, 1, 2, 3, 4, 5],
        cid: 1,
        cmd_sn: 1,
        chap: chap.map(|(user, secret)| ChapSecret {
            user: user.into(),
            secret: secret.to_vec(),
        }),
        offer: Offer::default(),
    }
}

/// Runs both machines until one side finishes.
fn exchange(params: LoginParams, policy: &mut Policy) -> Result<Negotiated, Error> {
    let mut target = TargetLogin::new(TargetDefaults::default());
    let (mut me, mut req) = InitiatorLogin::new(params);
    for _ in 0..16 {
        let step = target.handle(&req, policy);
        match me.handle(step.response())? {
            Step::Send(next) => req = next,
            Step::Complete(n) => {
                assert!(matches!(step, LoginStep::Complete(..)), "{step:?}");
                return Ok(*n);
            }
        }
    }
    panic!("login never ended");
}

#[test]
fn no_authentication_reaches_full_feature_phase() {
    let mut policy = Policy {
        chap: None,
        random: 0,
    };
    let n = exchange(params(Some(TARGET), None), &mut policy).expect("login");
    assert_eq!(n.tsih, 0x77);
    assert_eq!(n.tpgt, Some(3));
    assert!(n.immediate_data);
    assert!(!n.initial_r2t);
    assert!(n.max_send_data_segment_length >= 512);
    assert!(n.first_burst_length <= n.max_burst_length);
    assert!(serial_le(n.cmd_sn, n.max_cmd_sn));
}

fn serial_le(a: u32, b: u32) -> bool {
    iscsi_proto::serial::le(a, b)
}

#[test]
fn discovery_session() {
    let mut policy = Policy {
        chap: None,
        random: 0,
    };
    exchange(params(None, None), &mut policy).expect("discovery login");
}

#[test]
fn chap_with_every_algorithm() {
    for alg in [5u8, 6, 7, 8] {
        let mut policy = Policy {
            chap: Some(ChapCredentials {
                user: "host1".into(),
                secret: b"a secret of sixteen".to_vec(),
                mutual: None,
                algorithms: vec![alg],
            }),
            random: alg,
        };
        exchange(
            params(Some(TARGET), Some(("host1", b"a secret of sixteen"))),
            &mut policy,
        )
        .unwrap_or_else(|e| panic!("CHAP_A={alg}: {e}"));
    }
}

#[test]
fn wrong_secret_and_missing_credentials_fail() {
    let creds = ChapCredentials {
        user: "host1".into(),
        secret: b"a secret of sixteen".to_vec(),
        mutual: None,
        algorithms: vec![],
    };
    let mut policy = Policy {
        chap: Some(creds),
        random: 1,
    };
    let e = exchange(
        params(Some(TARGET), Some(("host1", b"wrong secret!!"))),
        &mut policy,
    );
    assert!(
        matches!(
            e,
            Err(Error::LoginRefused {
                class: 2,
                detail: 1
            })
        ),
        "{e:?}"
    );
    let e = exchange(params(Some(TARGET), None), &mut policy);
    assert!(e.is_err(), "login without CHAP against a CHAP target");
    let e = exchange(
        params(Some("iqn.2026-01.test.lanes:other"), None),
        &mut policy,
    );
    assert!(
        matches!(
            e,
            Err(Error::LoginRefused {
                class: 2,
                detail: 3
            })
        ),
        "{e:?}"
    );
}

/// A successful Login Response carrying `data`.
fn response(data: &[u8], transit: bool, csg: u8, nsg: u8) -> LoginResponse {
    LoginResponse {
        transit,
        continue_bit: false,
        csg,
        nsg,
        version_max: 0,
        version_active: 0,
        isid: [0; 6],
        tsih: 9,
        itt: 0,
        stat_sn: 0,
        exp_cmd_sn: 1,
        max_cmd_sn: 1,
        status_class: 0,
        status_detail: 0,
        data: Bytes::copy_from_slice(data),
    }
}

#[test]
fn hostile_responses_are_errors_not_panics() {
    let (mut me, _) = InitiatorLogin::new(params(Some(TARGET), Some(("u", b"s"))));
    let resp = |data: &[u8], transit: bool, nsg: u8| response(data, transit, 0, nsg);
    assert!(me.handle(&resp(b"AuthMethod=None\0", true, 1)).is_err());
    let (mut me, _) = InitiatorLogin::new(params(Some(TARGET), Some(("u", b"s"))));
    assert!(matches!(
        me.handle(&resp(b"AuthMethod=CHAP\0", false, 0)),
        Ok(Step::Send(_))
    ));
    for bad in [
        &b"CHAP_A=99\0CHAP_I=1\0CHAP_C=0x00\0"[..],
        b"CHAP_A=5\0",
        b"CHAP_A=5\0CHAP_I=1\0CHAP_C=zz\0",
        b"\xff\xfe",
    ] {
        let (mut m, _) = InitiatorLogin::new(params(Some(TARGET), Some(("u", b"s"))));
        let _ = m.handle(&resp(b"AuthMethod=CHAP\0", false, 0));
        assert!(m.handle(&resp(bad, false, 0)).is_err(), "{bad:?}");
    }
    let (mut me, _) = InitiatorLogin::new(params(Some(TARGET), None));
    assert!(matches!(me.handle(&resp(b"", true, 1)), Ok(Step::Send(_))));
    assert!(me
        .handle(&resp(b"MaxRecvDataSegmentLength=0\0", true, 3))
        .is_err());
}

/// A target that proposes keys of its own with T=0 and transits only once they are answered,
/// as LIO does (seen against Linux 6.1's iscsi_target_mod).
#[test]
fn keys_a_target_proposes_are_answered_before_it_transits() {
    let resp = response;
    let (mut login, _) = InitiatorLogin::new(params(Some(TARGET), None));
    let Step::Send(_) = login
        .handle(&resp(
            b"AuthMethod=None\0TargetPortalGroupTag=1\0",
            true,
            0,
            1,
        ))
        .unwrap()
    else {
        panic!("expected the operational request")
    };
    let proposals = b"HeaderDigest=None\0DataDigest=None\0MaxRecvDataSegmentLength=262144\0\
DefaultTime2Wait=2\0DefaultTime2Retain=0\0IFMarker=No\0OFMarker=Yes\0OFMarkInt=2048\0\
DataPDUInOrder=Yes\0DataSequenceInOrder=Yes\0X-com.example.Key=1\0TargetAlias=LIO Target\0";
    let Step::Send(answer) = login.handle(&resp(proposals, false, 1, 1)).unwrap() else {
        panic!("expected the answers")
    };
    assert!(answer.transit && answer.nsg == 3);
    let text = String::from_utf8(answer.data.to_vec()).unwrap();
    let keys: Vec<&str> = text.split('\0').filter(|k| !k.is_empty()).collect();
    assert_eq!(
        keys,
        [
            "DefaultTime2Wait=2",
            "DefaultTime2Retain=0",
            "IFMarker=No",
            "OFMarker=No",
            "OFMarkInt=Irrelevant",
            "DataPDUInOrder=Yes",
            "DataSequenceInOrder=Yes",
            "X-com.example.Key=NotUnderstood",
        ],
        "answers to the target's own proposals only (not to answers or declarations)"
    );
    let Step::Complete(negotiated) = login.handle(&resp(b"", true, 1, 3)).unwrap() else {
        panic!("expected the full feature phase")
    };
    assert_eq!(negotiated.max_send_data_segment_length, 262_144);
}
