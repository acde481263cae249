//! Create-context bodies, IOCTL payloads, response chains, related-operation ids and the
//! interim response.

use proptest::prelude::*;
use smb_proto::crypto::{SigningAlgorithm, SigningKey};
use smb_proto::msg::create_ctx::*;
use smb_proto::msg::ioctl::*;
use smb_proto::msg::*;
use smb_proto::{
    split_compound, Command, Flags, Header, HeaderIds, NtStatus, RelatedIds, ResponseChain,
};

fn blank() -> Header {
    Header::decode(
        &[0xFE, b'S', b'M', b'B', 64, 0]
            .into_iter()
            .chain([0; 58])
            .collect::<Vec<_>>(),
    )
    .unwrap()
}

proptest! {
    #[test]
    fn leases_round_trip(key in any::<[u8; 16]>(), pk in any::<[u8; 16]>(), state in 0u32..8, flags in any::<u32>(), epoch in any::<u16>(), v2 in any::<bool>()) {
        let l = if v2 { Lease::V2 { key, state, flags, parent_key: pk, epoch } } else { Lease::V1 { key, state, flags } };
        let mut b = Vec::new();
        l.encode(&mut b);
        prop_assert_eq!(b.len(), if v2 { 52 } else { 32 });
        prop_assert_eq!(Lease::decode(&b).unwrap(), l);
        prop_assert_eq!(l.key(), key);
    }

    #[test]
    fn durable_contexts_round_trip(t in any::<u32>(), f in any::<u32>(), g in any::<[u8; 16]>(), p in any::<u64>(), v in any::<u64>()) {
        let d = DurableRequestV2 { timeout: t, flags: f, create_guid: g };
        let mut b = Vec::new();
        d.encode(&mut b);
        prop_assert_eq!(DurableRequestV2::decode(&b).unwrap(), d);
        let r = DurableReconnectV2 { file_id: FileId { persistent: p, volatile: v }, create_guid: g, flags: f };
        let mut b = Vec::new();
        r.encode(&mut b);
        prop_assert_eq!(DurableReconnectV2::decode(&b).unwrap(), r);
    }

    #[test]
    fn network_interfaces_round_trip(list in proptest::collection::vec((any::<u32>(), 0u32..4, any::<u64>(), any::<bool>(), any::<[u8; 16]>()), 1..5)) {
        let nics: Vec<NetworkInterface> = list.into_iter().map(|(i, c, s, v6, a)| NetworkInterface {
            if_index: i, capability: c, link_speed: s,
            address: if v6 { std::net::IpAddr::from(a) } else { std::net::IpAddr::from([a[0], a[1], a[2], a[3]]) },
        }).collect();
        let mut b = Vec::new();
        encode_network_interfaces(&nics, &mut b);
        prop_assert_eq!(b.len(), 152 * nics.len());
        prop_assert_eq!(decode_network_interfaces(&b).unwrap(), nics);
    }

    #[test]
    fn response_chains_split_and_sign(lens in proptest::collection::vec(0usize..50, 1..5), key in any::<[u8; 16]>()) {
        let mut chain = ResponseChain::new();
        for (i, n) in lens.iter().enumerate() {
            let mut h = blank();
            h.command = Command::Echo;
            h.message_id = i as u64;
            h.flags = Flags(Flags::SERVER_TO_REDIR | if i > 0 { Flags::RELATED_OPERATIONS } else { 0 });
            let mut m = h.to_bytes().to_vec();
            EchoResponse.encode(&mut m);
            m.extend(std::iter::repeat_n(0xAA, *n));
            chain.push(&m);
        }
        let (mut frame, ranges) = chain.finish();
        let k = SigningKey::new(SigningAlgorithm::AesCmac, key);
        for r in &ranges {
            k.sign(&mut frame[r.clone()]).unwrap();
        }
        let els = split_compound(&frame).unwrap();
        prop_assert_eq!(els.len(), lens.len());
        for (e, r) in els.iter().zip(&ranges) {
            prop_assert_eq!(e.offset..e.offset + e.bytes.len(), r.clone());
            prop_assert!(k.verify(e.bytes));
            prop_assert!(e.header.flags.is_signed());
        }
    }
}

#[test]
fn wrong_sizes_are_errors() {
    assert!(Lease::decode(&[0; 40]).is_err());
    assert!(DurableRequestV2::decode(&[0; 31]).is_err());
    assert!(DurableReconnectV2::decode(&[0; 35]).is_err());
    assert!(decode_durable_reconnect_v1(&[0; 15]).is_err());
    assert_eq!(decode_maximal_access_request(&[]).unwrap(), None);
    assert_eq!(
        decode_maximal_access_request(&7u64.to_le_bytes()).unwrap(),
        Some(7)
    );
    assert!(decode_maximal_access_request(&[0; 4]).is_err());
    assert!(decode_u64_context(&[0; 9]).is_err());
    assert!(decode_network_interfaces(&[0; 151]).is_err());
    let mut two = Vec::new();
    let nic = NetworkInterface {
        if_index: 1,
        capability: 1,
        link_speed: 1,
        address: [10, 0, 0, 1].into(),
    };
    encode_network_interfaces(&[nic, nic], &mut two);
    two[0] = 8; // Next pointing into the same entry
    assert!(decode_network_interfaces(&two).is_err());
}

#[test]
fn fixed_response_payloads_have_their_sizes() {
    let mut b = Vec::new();
    encode_maximal_access_response(0, 0x1F01FF, &mut b);
    assert_eq!(b, [0, 0, 0, 0, 0xFF, 0x01, 0x1F, 0]);
    let mut b = Vec::new();
    encode_on_disk_id_response([1; 16], 2, &mut b);
    assert_eq!(b.len(), 32);
    let mut b = Vec::new();
    encode_validate_negotiate_response(0x2F, [3; 16], 1, 0x0311, &mut b);
    assert_eq!(b.len(), 24);
    assert_eq!(&b[20..], &[1, 0, 0x11, 0x03]);
}

#[test]
fn a_lease_inside_a_create_request() {
    let mut lease = Vec::new();
    Lease::V2 {
        key: [9; 16],
        state: 7,
        flags: 0,
        parent_key: [0; 16],
        epoch: 1,
    }
    .encode(&mut lease);
    let mut dh = Vec::new();
    DurableRequestV2 {
        timeout: 0,
        flags: DH2_FLAG_PERSISTENT,
        create_guid: [5; 16],
    }
    .encode(&mut dh);
    let req = CreateRequest {
        name: &[b'a', 0],
        contexts: vec![
            CreateContext {
                name: b"DH2Q",
                data: &dh,
            },
            CreateContext {
                name: b"RqLs",
                data: &lease,
            },
            CreateContext {
                name: b"MxAc",
                data: &[],
            },
        ],
        ..Default::default()
    };
    let bytes = encode_message(&blank(), &req);
    let back = CreateRequest::decode(&bytes).unwrap();
    let l = Lease::decode(back.context(create::CTX_REQUEST_LEASE).unwrap().data).unwrap();
    assert!(matches!(
        l,
        Lease::V2 {
            state: 7,
            epoch: 1,
            ..
        }
    ));
    assert!(
        DurableRequestV2::decode(back.context(b"DH2Q").unwrap().data)
            .unwrap()
            .is_persistent()
    );
    assert_eq!(back.context(b"MxAc").unwrap().data, &[] as &[u8]);
    assert!(back.context(b"QFid").is_none());
}

#[test]
fn related_ids_and_the_interim_response() {
    let prev = RelatedIds {
        session_id: 7,
        tree_id: 3,
        file_id: Some(FileId {
            persistent: 1,
            volatile: 2,
        }),
    };
    let mut h = blank();
    h.session_id = u64::MAX;
    h.ids = HeaderIds::Sync {
        process_id: 0,
        tree_id: u32::MAX,
    };
    assert_eq!(prev.ids_for(&h), (u64::MAX, Some(u32::MAX)));
    assert_eq!(prev.file_id_for(&h, FileId::RELATED), Some(FileId::RELATED));
    h.flags = Flags(Flags::RELATED_OPERATIONS);
    assert_eq!(prev.ids_for(&h), (7, Some(3)));
    assert_eq!(prev.file_id_for(&h, FileId::RELATED), prev.file_id);
    assert_eq!(RelatedIds::default().file_id_for(&h, FileId::RELATED), None);

    let p = Header::pending_response_to(&h, 0x55, 1);
    let b = p.to_bytes();
    let back = Header::decode(&b).unwrap();
    assert_eq!(back.ids, HeaderIds::Async { async_id: 0x55 });
    assert_eq!(back.nt_status(), NtStatus::PENDING);
    assert!(back.flags.is_response());
    assert_ne!(back.wire_flags() & Flags::ASYNC_COMMAND, 0);
}

proptest! {
    #[test]
    fn durable_responses_and_app_instance_round_trip(t in any::<u32>(), f in any::<u32>(), g in any::<[u8; 16]>()) {
        let r = DurableResponseV2 { timeout: t, flags: f };
        let mut b = Vec::new();
        r.encode(&mut b);
        prop_assert_eq!(b.len(), 8);
        prop_assert_eq!(DurableResponseV2::decode(&b).unwrap(), r);
        let mut b = Vec::new();
        encode_app_instance_id(&g, &mut b);
        prop_assert_eq!(b.len(), 20);
        prop_assert_eq!(decode_app_instance_id(&b).unwrap(), g);
    }

    #[test]
    fn durable_decoders_reject_other_sizes(data in proptest::collection::vec(any::<u8>(), 0..64)) {
        prop_assert_eq!(DurableRequestV2::decode(&data).is_ok(), data.len() == 32);
        prop_assert_eq!(DurableReconnectV2::decode(&data).is_ok(), data.len() == 36);
        prop_assert_eq!(DurableResponseV2::decode(&data).is_ok(), data.len() == 8);
        prop_assert_eq!(decode_durable_request_v1(&data).is_ok(), data.len() == 16);
        prop_assert_eq!(decode_durable_reconnect_v1(&data).is_ok(), data.len() == 16);
        let app_ok = data.len() == 20 && data[0] == 20 && data[1] == 0;
        prop_assert_eq!(decode_app_instance_id(&data).is_ok(), app_ok);
    }
}

/// A CREATE carrying DH2Q, RqLs and AppInstanceId survives encode and decode, and each
/// context's body decodes back from the parsed request.
#[test]
fn create_with_durable_contexts_round_trips() {
    use smb_proto::msg::create::{
        CTX_APP_INSTANCE_ID, CTX_DURABLE_HANDLE_REQUEST, CTX_DURABLE_HANDLE_REQUEST_V2,
    };
    let dh2q = DurableRequestV2 {
        timeout: 300_000,
        flags: DH2_FLAG_PERSISTENT,
        create_guid: [7; 16],
    };
    let mut d = Vec::new();
    dh2q.encode(&mut d);
    let mut app = Vec::new();
    encode_app_instance_id(&[9; 16], &mut app);
    let name: Vec<u8> = "dir\\f.dat"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    let req = CreateRequest {
        security_flags: 0,
        requested_oplock_level: 9,
        impersonation_level: 2,
        smb_create_flags: 0,
        desired_access: 0x0012_019F,
        file_attributes: 0,
        share_access: 7,
        create_disposition: 3,
        create_options: 0,
        name: &name,
        contexts: vec![
            CreateContext {
                name: CTX_DURABLE_HANDLE_REQUEST_V2,
                data: &d,
            },
            CreateContext {
                name: CTX_APP_INSTANCE_ID,
                data: &app,
            },
        ],
    };
    let b = encode_message(&blank(), &req);
    let back = CreateRequest::decode(&b).unwrap();
    assert_eq!(back.name_string().unwrap(), "dir\\f.dat");
    let got = DurableRequestV2::decode(back.context(CTX_DURABLE_HANDLE_REQUEST_V2).unwrap().data)
        .unwrap();
    assert_eq!(got, dh2q);
    assert!(got.is_persistent());
    let id = decode_app_instance_id(back.context(CTX_APP_INSTANCE_ID).unwrap().data).unwrap();
    assert_eq!(id, [9; 16]);
    assert!(back.context(CTX_DURABLE_HANDLE_REQUEST).is_none());
}

#[test]
fn malformed_durable_contexts_are_errors() {
    // A DH2Q one byte short, a DHnQ with data, an AppInstanceId with a wrong StructureSize.
    assert!(DurableRequestV2::decode(&[0xFF; 31]).is_err());
    assert!(decode_durable_request_v1(&[0; 17]).is_err());
    let mut app = Vec::new();
    encode_app_instance_id(&[1; 16], &mut app);
    app[0] = 24;
    assert!(decode_app_instance_id(&app).is_err());
    assert!(DurableResponseV2::decode(&[0; 16]).is_err());
}
