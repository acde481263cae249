//! Property tests: nothing a peer can send makes the codec, the text parser, the login machine
//! or the Data-Out tracker panic.

use bytes::{Bytes, BytesMut};
use iscsi_proto::chap::ChapCredentials;
use iscsi_proto::login::{LoginOutcome, LoginPolicy, LoginRefusal, LoginStep, TargetLogin};
use iscsi_proto::negotiation::{SessionType, TargetDefaults};
use iscsi_proto::pdu::{DataOut, LoginRequest, TextRequest};
use iscsi_proto::text_exchange::{answer_keys, TextContext, TextInput, TextResponder};
use iscsi_proto::window::{DataOutTracker, WriteParams};
use iscsi_proto::{text, Framer};
use proptest::prelude::*;

struct AnyPolicy {
    chap: bool,
}

impl LoginPolicy for AnyPolicy {
    fn portal_group_tag(&self) -> u16 {
        1
    }
    fn authorize(&mut self, _: &str, _: &str) -> Result<Option<ChapCredentials>, LoginRefusal> {
        Ok(self.chap.then(|| ChapCredentials {
            user: "u".into(),
            secret: b"0123456789abcdef".to_vec(),
            mutual: Some(("t".into(), b"fedcba9876543210".to_vec())),
            algorithms: vec![],
        }))
    }
    fn discovery_auth(&mut self, _: &str) -> Result<Option<ChapCredentials>, LoginRefusal> {
        Ok(None)
    }
    fn admit(&mut self, login: &LoginOutcome) -> Result<u16, LoginRefusal> {
        Ok(if login.tsih == 0 { 1 } else { login.tsih })
    }
    fn fill_random(&mut self, buf: &mut [u8]) {
        buf.fill(7);
    }
}

/// Key text built from the vocabulary a login uses, with random values.
fn key_text() -> impl Strategy<Value = Bytes> {
    let keys = prop::sample::select(vec![
        "InitiatorName",
        "TargetName",
        "SessionType",
        "AuthMethod",
        "CHAP_A",
        "CHAP_N",
        "CHAP_R",
        "CHAP_I",
        "CHAP_C",
        "HeaderDigest",
        "MaxBurstLength",
        "FirstBurstLength",
        "InitialR2T",
        "ImmediateData",
        "MaxRecvDataSegmentLength",
        "X-foo",
        "SendTargets",
        "TargetAlias",
    ]);
    let values = prop::sample::select(vec![
        "iqn.2026-01.x:y",
        "Normal",
        "Discovery",
        "None",
        "CHAP",
        "CHAP,None",
        "5",
        "7,5",
        "u",
        "0x00",
        "0b",
        "0xzz",
        "Yes",
        "No",
        "512",
        "16777215",
        "99999999999999999999",
        "",
        "All",
    ]);
    proptest::collection::vec((keys, values), 0..8).prop_map(|pairs| text::encode(&pairs))
}

prop_compose! {
    fn login_request()(
        flags in any::<(bool, bool, u8, u8)>(), versions in any::<(u8, u8)>(), tsih in prop::sample::select(vec![0u16, 1, 9]),
        small_ids in any::<(u8, u8)>(), seqs in any::<(u32, u32)>(),
        data in prop_oneof![key_text(), proptest::collection::vec(any::<u8>(), 0..200).prop_map(Bytes::from)],
    ) -> LoginRequest {
        LoginRequest {
            transit: flags.0, continue_bit: flags.1, csg: flags.2 & 3, nsg: flags.3 & 3,
            version_max: versions.0 % 2, version_min: versions.1 % 2, isid: [small_ids.0 % 2, 0, 0, 0, 0, 0],
            tsih, itt: u32::from(small_ids.1 % 2), cid: 0, cmd_sn: seqs.0, exp_stat_sn: seqs.1, data,
        }
    }
}

proptest! {
    #[test]
    fn framer_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2000), mode in 0u8..4) {
        let framer = Framer { header_digest: mode & 1 != 0, data_digest: mode & 2 != 0, max_recv_data_segment_length: 1024 };
        let mut buf = BytesMut::from(&bytes[..]);
        for _ in 0..64 {
            let _ = framer.bytes_needed(&buf);
            match framer.decode(&mut buf) {
                Ok(Some(_)) => continue,
                _ => break,
            }
        }
    }

    #[test]
    fn text_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(pairs) = text::parse_allow_repeats(&bytes) {
            for (_, v) in pairs {
                let _ = text::parse_number(v);
                let _ = text::decode_binary(v);
            }
        }
        let _ = text::parse(&bytes);
    }

    #[test]
    fn login_never_panics(reqs in proptest::collection::vec(login_request(), 1..20), chap: bool) {
        let mut login = TargetLogin::new(TargetDefaults::default());
        let mut policy = AnyPolicy { chap };
        for req in &reqs {
            match login.handle(req, &mut policy) {
                LoginStep::Continue(_) => {}
                LoginStep::Complete(..) | LoginStep::Failed(..) => break,
            }
        }
    }

    #[test]
    fn text_exchange_never_panics(reqs in proptest::collection::vec((key_text(), any::<(bool, u32, u8)>()), 1..10)) {
        let targets = vec![("iqn.2026-01.x:y".to_string(), vec![("127.0.0.1:3260".parse().unwrap(), 1)])];
        let ctx = TextContext { session_type: SessionType::Discovery, current_target: None, targets: &targets, max_recv_data_segment_length: 8192 };
        let mut r = TextResponder::new(512);
        for (i, (data, (c, ttt, itt))) in reqs.into_iter().enumerate() {
            let req = TextRequest { continue_bit: c, ttt: if ttt % 3 == 0 { u32::MAX } else { ttt % 4 }, itt: u32::from(itt % 2), data, ..TextRequest::default() };
            if let Ok(TextInput::Request(text)) = r.receive(&req, i as u32) {
                if let Ok(answer) = answer_keys(&text, &ctx) {
                    r.respond(&req, answer.text, i as u32);
                }
            }
        }
    }

    #[test]
    fn data_out_tracker_never_panics(
        p in any::<(u32, u32, bool, bool, bool, u32, u32, u16)>(),
        pdus in proptest::collection::vec(any::<(bool, u8, u32, u32, u16)>(), 0..30),
    ) {
        let params = WriteParams {
            expected_data_length: p.0 % 100_000, immediate_length: p.1 % 10_000, unsolicited_follows: p.2,
            initial_r2t: p.3, immediate_data: p.4, first_burst_length: p.5 % 70_000, max_burst_length: p.6 % 70_000,
            max_outstanding_r2t: p.7 % 4, max_recv_data_segment_length: 8192,
        };
        if let Ok(mut t) = DataOutTracker::new(params) {
            let mut next = 0u32;
            let mut r2ts = Vec::new();
            for (f, ttt, sn, off, len) in pdus {
                t.next_r2ts(|| { next += 1; next }, &mut r2ts);
                let pdu = DataOut {
                    final_bit: f, ttt: if ttt % 4 == 0 { u32::MAX } else { u32::from(ttt % 4) },
                    data_sn: sn % 4, buffer_offset: off % 100_000, data: Bytes::from(vec![0; usize::from(len % 9000)]),
                    ..DataOut::default()
                };
                let _ = t.on_data_out(&pdu);
                let _ = t.is_complete();
            }
        }
    }
}
