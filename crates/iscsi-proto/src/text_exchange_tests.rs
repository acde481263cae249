//! Tests of the full-feature text exchange.

use super::*;

fn targets() -> Vec<TargetPortals> {
    vec![
        (
            "iqn.2026-01.org.lanes:a".into(),
            vec![
                ("192.0.2.1:3260".parse().unwrap(), 1),
                ("[2001:db8::1]:3260".parse().unwrap(), 2),
            ],
        ),
        (
            "iqn.2026-01.org.lanes:b".into(),
            vec![("192.0.2.2:3261".parse().unwrap(), 1)],
        ),
    ]
}

fn ctx(session_type: SessionType, targets: &[TargetPortals]) -> TextContext<'_> {
    TextContext {
        session_type,
        current_target: (session_type == SessionType::Normal).then_some("iqn.2026-01.org.lanes:b"),
        targets,
        max_recv_data_segment_length: 262_144,
    }
}

fn request(data: &[u8]) -> TextRequest {
    TextRequest {
        final_bit: true,
        itt: 5,
        ttt: RESERVED_TAG,
        data: Bytes::copy_from_slice(data),
        ..TextRequest::default()
    }
}

#[test]
fn send_targets_all_in_discovery() {
    let t = targets();
    let a = answer_keys(b"SendTargets=All\0", &ctx(SessionType::Discovery, &t)).unwrap();
    assert_eq!(
        &a.text[..],
        &b"TargetName=iqn.2026-01.org.lanes:a\0TargetAddress=192.0.2.1:3260,1\0\
TargetAddress=[2001:db8::1]:3260,2\0TargetName=iqn.2026-01.org.lanes:b\0\
TargetAddress=192.0.2.2:3261,1\0"[..]
    );
    let one = answer_keys(
        b"SendTargets=iqn.2026-01.org.lanes:b\0",
        &ctx(SessionType::Discovery, &t),
    )
    .unwrap();
    assert_eq!(
        &one.text[..],
        b"TargetName=iqn.2026-01.org.lanes:b\0TargetAddress=192.0.2.2:3261,1\0"
    );
    let none = answer_keys(b"SendTargets=iqn.x\0", &ctx(SessionType::Discovery, &t)).unwrap();
    assert!(none.text.is_empty());
}

#[test]
fn send_targets_in_normal_session() {
    let t = targets();
    let c = ctx(SessionType::Normal, &t);
    let own = answer_keys(b"SendTargets=\0", &c).unwrap();
    assert!(own
        .text
        .starts_with(b"TargetName=iqn.2026-01.org.lanes:b\0"));
    let all = answer_keys(b"SendTargets=All\0", &c).unwrap();
    let discovery = answer_keys(b"SendTargets=All\0", &ctx(SessionType::Discovery, &t)).unwrap();
    assert_eq!(
        all.text, discovery.text,
        "All answers every target in a normal session too"
    );
}

#[test]
fn full_feature_keys() {
    let t = targets();
    let a = answer_keys(
        b"MaxRecvDataSegmentLength=65536\0MaxBurstLength=512\0X-foo=1\0InitiatorAlias=h\0",
        &ctx(SessionType::Normal, &t),
    )
    .unwrap();
    assert_eq!(a.max_xmit_data_segment_length, Some(65536));
    assert_eq!(
        &a.text[..],
        b"MaxRecvDataSegmentLength=262144\0MaxBurstLength=Reject\0X-foo=NotUnderstood\0"
    );
    assert!(answer_keys(b"A=1\0A=2\0", &ctx(SessionType::Normal, &t)).is_err());
}

#[test]
fn long_answer_is_split_and_continued() {
    let many: Vec<TargetPortals> = (0..100)
        .map(|i| {
            (
                format!("iqn.2026-01.org.lanes:disk{i}"),
                vec![("192.0.2.1:3260".parse().unwrap(), 1)],
            )
        })
        .collect();
    let mut r = TextResponder::new(512);
    let req = request(b"SendTargets=All\0");
    let TextInput::Request(text) = r.receive(&req, 1).unwrap() else {
        panic!()
    };
    let answer = answer_keys(&text, &ctx(SessionType::Discovery, &many))
        .unwrap()
        .text;
    assert!(answer.len() > 512 * 3);
    let mut got = BytesMut::new();
    let mut resp = r.respond(&req, answer.clone(), 1);
    let mut ttt = 2;
    while resp.continue_bit {
        assert!(!resp.final_bit && resp.ttt != RESERVED_TAG && resp.data.len() == 512);
        got.extend_from_slice(&resp.data);
        let cont = TextRequest {
            ttt: resp.ttt,
            data: Bytes::new(),
            ..req.clone()
        };
        let TextInput::Send(next) = r.receive(&cont, ttt).unwrap() else {
            panic!()
        };
        ttt += 1;
        resp = next;
    }
    assert!(resp.final_bit && resp.ttt == RESERVED_TAG);
    got.extend_from_slice(&resp.data);
    assert_eq!(got.freeze(), answer);
    assert!(!r.has_pending());
    // A stale TTT is an error.
    let stale = TextRequest {
        ttt: 77,
        ..req.clone()
    };
    assert_eq!(
        r.receive(&stale, 9),
        Err(TextExchangeError::UnknownTransferTag(77))
    );
}

#[test]
fn initiator_text_in_pieces() {
    let mut r = TextResponder::new(8192);
    let mut first = request(b"SendTar");
    first.continue_bit = true;
    first.final_bit = false;
    let TextInput::Send(ack) = r.receive(&first, 40).unwrap() else {
        panic!()
    };
    assert!(ack.data.is_empty() && ack.ttt == 40 && !ack.final_bit);
    let second = TextRequest {
        ttt: 40,
        data: Bytes::from_static(b"gets=All\0"),
        ..request(b"")
    };
    let TextInput::Request(text) = r.receive(&second, 41).unwrap() else {
        panic!()
    };
    assert_eq!(&text[..], b"SendTargets=All\0");
}

#[test]
fn new_request_drops_pending_answer() {
    let mut r = TextResponder::new(512);
    let req = request(b"SendTargets=All\0");
    let resp = r.respond(&req, Bytes::from(vec![b'x'; 2000]), 3);
    assert!(resp.continue_bit && r.has_pending());
    let fresh = TextRequest {
        itt: 6,
        ..request(b"SendTargets=All\0")
    };
    assert!(matches!(
        r.receive(&fresh, 4).unwrap(),
        TextInput::Request(_)
    ));
    assert!(!r.has_pending());
}
