//! Shared harness for the login exchange tests: a fake policy, request builders, and helpers
//! that read responses.
#![allow(dead_code)]

use iscsi_proto::chap::ChapCredentials;
use iscsi_proto::login::{LoginOutcome, LoginPolicy, LoginRefusal, LoginStep, TargetLogin};
use iscsi_proto::pdu::{LoginRequest, LoginResponse};
use iscsi_proto::text;

pub const TARGET: &str = "iqn.2026-01.org.lanes:disk1";
pub const INITIATOR: &str = "iqn.1993-08.org.debian:01:abc";

pub struct Policy {
    pub chap: Option<ChapCredentials>,
    pub admitted: Vec<LoginOutcome>,
    pub random: u8,
}

impl Policy {
    pub fn new(chap: Option<ChapCredentials>) -> Self {
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

pub fn req(csg: u8, nsg: u8, transit: bool, keys: &[(&str, &str)]) -> LoginRequest {
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

pub fn keys(resp: &LoginResponse) -> Vec<(String, String)> {
    text::parse(&resp.data)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

pub fn get(resp: &LoginResponse, key: &str) -> Option<String> {
    keys(resp)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

pub fn cont(step: LoginStep) -> LoginResponse {
    match step {
        LoginStep::Continue(r) => {
            assert_eq!(r.status_class, 0);
            r
        }
        other => panic!("expected Continue, got {other:?}"),
    }
}

pub fn failed(step: LoginStep, expect: LoginRefusal) {
    match step {
        LoginStep::Failed(r, refusal) => {
            assert_eq!(refusal, expect);
            assert_eq!((r.status_class, r.status_detail), expect.status());
        }
        other => panic!("expected Failed({expect:?}), got {other:?}"),
    }
}

pub const SECURITY: &[(&str, &str)] = &[
    ("InitiatorName", INITIATOR),
    ("InitiatorAlias", "host1"),
    ("SessionType", "Normal"),
    ("TargetName", TARGET),
    ("AuthMethod", "None"),
];

pub const OPERATIONAL: &[(&str, &str)] = &[
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

pub fn finish_operational(
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
